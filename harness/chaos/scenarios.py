"""The chaos scenarios: what each injects while the workload streams, how the cluster is repaired
afterwards, and what each checks beyond the common checks (harness/chaos/checks.py).

Contract: `SCENARIOS[name]` is a `Scenario(name, summary, inject, repair, extras, check,
recovery_bound)`; `inject(ctx, progress) -> FaultEvent` waits for its trigger (streams under
way), injects and returns when the fault is over (healed, thawed) or done (killed); `repair(ctx,
event)` brings the cluster back to full strength for the next scenario (revive a killed node
under its id, wait for re-registration); `extras(ctx)` are extra clients (abort storm, stalled
consumer) whose records are not compared; `check(ctx, before, after) -> dict` says what the
scenario proved (`ok` plus counts), from node logs. `recovery_bound` says whether the recovery
time must stay within the liveness window plus one re-prefill. The hooks of slow-consumer and
abort-storm are harness/chaos/client_scenarios.py's, those of hostile-peer hostile_scenario.py's.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from harness.chaos import client_scenarios, hostile_scenario
from harness.chaos.chaos_workload import RequestSpec
from harness.chaos.checks import kv_fault_audit
from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent, Progress

PARTITIONED_NODE = "decode-1"
NUM_KV_FLIPS = 4      # per prefill node: one transfer's chunk fails every attempt (max_attempts = 4)
NUM_KV_DROPS = 2      # per prefill node: resent after the sender's ACK timeout
PREFILL_DELAY_MS = 1500


@dataclass
class Ctx:
    cluster: Any                       # ChaosCluster
    driver: Any
    rng: Any                           # random.Random, seeded
    specs: list[RequestSpec]
    liveness_s: float
    stall_hold_s: float = 60.0         # how long a stalled client waits to be cut off
    fault: FaultEvent | None = None    # this pass's fault, once injected
    kv_faults_mark: int = 0            # chaos_kv_fault events before this pass


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    inject: Callable[[Ctx, Progress], Awaitable[FaultEvent]]
    repair: Callable[[Ctx, FaultEvent], None] | None = None
    extras: Callable[[Ctx], list[Callable[[Progress], Awaitable[list[StreamRecord]]]]] | None = None
    check: Callable[[Ctx, dict, dict], dict] | None = None
    recovery_bound: bool = True


# -- helpers ---------------------------------------------------------------------------------
def busiest_decode(ctx: Ctx, live: list[StreamRecord]) -> str:
    """The live decode node serving the most live streams (SSE header / bus trace), else the one
    whose last published capacity shows the most running sequences."""
    alive = [n for n in ctx.cluster.decode_ids() if ctx.cluster.nodes[n].alive]
    counts = Counter(r.decode_node for r in live if r.decode_node is not None and r.decode_node in alive)
    if counts:
        return counts.most_common(1)[0][0]
    return max(alive, key=lambda n: ((ctx.cluster.kv_capacity(n) or {}).get("num_running", 0), ctx.rng.random()))


async def wait_event(proc: Any, name: str, count: int, timeout: float, **fields: Any) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(proc.find(name, **fields)) >= count:
            return True
        await asyncio.sleep(0.02)
    return False


def revive(ctx: Ctx, event: FaultEvent) -> None:
    ctx.cluster.revive(event.target)


def rejoined(ctx: Ctx, node_id: str, joined_before: int, timeout: float = 30.0) -> bool:
    try:
        ctx.cluster.broker.wait_for("node_joined", timeout=timeout, node_id=node_id, count=joined_before + 1)
        return True
    except AssertionError:
        return False


# -- kill-decode -----------------------------------------------------------------------------
async def kill_decode(ctx: Ctx, progress: Progress) -> FaultEvent:
    live = await progress.streaming(3)
    victim = busiest_decode(ctx, live)
    at = time.monotonic()
    await asyncio.to_thread(ctx.cluster.kill, victim)
    return FaultEvent(at, victim, {"num_live_streams": len(live)})


# -- freeze-decode ---------------------------------------------------------------------------
async def freeze_decode(ctx: Ctx, progress: Progress) -> FaultEvent:
    live = await progress.streaming(3)
    victim = busiest_decode(ctx, live)
    broker = ctx.cluster.broker
    num_left, num_joined = len(broker.find("node_left", node_id=victim)), len(broker.find("node_joined", node_id=victim))
    num_cancelled = len(ctx.cluster.nodes[victim].find("decode_cancelled"))
    at = time.monotonic()
    ctx.cluster.nodes[victim].signal(signal.SIGSTOP)
    declared = await wait_event(broker, "node_left", num_left + 1, 10 * ctx.liveness_s + 5, node_id=victim)
    await asyncio.sleep(1.0)   # the moved streams run on elsewhere while the node is still frozen
    ctx.cluster.nodes[victim].signal(signal.SIGCONT)
    return FaultEvent(at, victim, {"declared_lost": declared, "lost_after_s": round(time.monotonic() - at - 1.0, 3),
                                   "joined_before": num_joined, "cancelled_before": num_cancelled},
                      healed_at=time.monotonic())


def after_thaw(ctx: Ctx, event: FaultEvent) -> None:
    event.details["rejoined"] = rejoined(ctx, event.target, event.details["joined_before"])


def check_freeze(ctx: Ctx, before: dict, after: dict) -> dict:
    event = ctx.fault
    assert event is not None   # checks run only after an injected fault
    node = ctx.cluster.nodes[event.target]
    orphans_freed = len(node.find("decode_cancelled")) - event.details["cancelled_before"]
    ok = bool(event.details.get("declared_lost") and event.details.get("rejoined"))
    return {"ok": ok, "declared_lost": event.details.get("declared_lost"), "rejoined": event.details.get("rejoined"),
            "orphans_cancelled_on_thaw": orphans_freed}


# -- kill-prefill ----------------------------------------------------------------------------
async def kill_prefill(ctx: Ctx, progress: Progress) -> FaultEvent:
    """Only the victim's prefills are slowed, so the re-sent prefill on a survivor runs at speed. The
    victim is the prefill node that has served the most (the scheduler breaks ties among idle
    prefill nodes the same way every time, so that node is the one that gets the next prefill);
    when it starts none within its share of the 30 s, the next node is slowed instead."""
    cluster = ctx.cluster
    alive = [n for n, p in cluster.nodes.items() if n.startswith("prefill") and p.alive]
    candidates = sorted(alive, key=lambda n: (len(cluster.nodes[n].find("prefill_done")), ctx.rng.random()), reverse=True)
    started = None
    for victim in candidates * 2:   # the favourite may get no prefill this pass: try the others in turn
        mark = len(cluster.nodes[victim].find("chaos_prefill_started"))
        cluster.control(prefill_delay_ms=PREFILL_DELAY_MS, prefill_delay_node=victim)

        def prefill_started(v: str = victim, m: int = mark) -> bool:
            return len(cluster.nodes[v].find("chaos_prefill_started")) > m
        started = await progress.wait_for(prefill_started, timeout=30.0 / (2 * len(candidates)))
        if started:
            break
    at = time.monotonic()
    await asyncio.to_thread(cluster.kill, victim)
    cluster.control()
    return FaultEvent(at, victim, {"killed": "mid-prefill" if started else "no prefill started in 30 s"})


# -- restart-broker --------------------------------------------------------------------------
async def restart_broker(ctx: Ctx, progress: Progress) -> FaultEvent:
    live = await progress.streaming(3)
    at = time.monotonic()
    await asyncio.to_thread(ctx.cluster.restart_broker, True)
    return FaultEvent(at, "broker", {"num_live_streams": len(live)}, healed_at=time.monotonic())


def broker_rejoined(ctx: Ctx, event: FaultEvent) -> None:
    for node_id, proc in ctx.cluster.nodes.items():
        if proc.alive:
            ctx.cluster.broker.wait_for("node_joined", timeout=30, node_id=node_id)


# -- kill-broker (two brokers) ------------------------------------------------------------------
async def kill_broker(ctx: Ctx, progress: Progress) -> FaultEvent:
    """SIGKILL the second broker mid-stream: the streams through it move to the first."""
    live = await progress.streaming(3)
    at = time.monotonic()
    await asyncio.to_thread(ctx.cluster.kill_broker, 1)
    return FaultEvent(at, "broker", {"num_live_streams": len(live), "killed": "broker-1"})


def broker_back(ctx: Ctx, event: FaultEvent) -> None:
    """Restart the killed broker on its port; every live process registers with it again."""
    broker = ctx.cluster.start_broker(1)
    for node_id, proc in ctx.cluster.nodes.items():
        if proc.alive:
            broker.wait_for("node_joined", timeout=30, node_id=node_id)


def check_kill_broker(ctx: Ctx, before: dict, after: dict) -> dict:
    """The survivor adopted the killed broker's requests (both ends announced them)."""
    adopted = sum(e.get("num_requests", 0) for e in ctx.cluster.broker.find("requests_adopted"))
    return {"ok": adopted > 0, "requests_adopted": adopted}


# -- corrupt-kv / drop-kv --------------------------------------------------------------------
def kv_fault(kind: str, count: int) -> Callable[[Ctx, Progress], Awaitable[FaultEvent]]:
    async def inject(ctx: Ctx, progress: Progress) -> FaultEvent:
        await progress.streaming(1)
        at = time.monotonic()
        ctx.cluster.control(**{kind: count})
        # Let the rest of the workload's transfers meet the armed faults, then disarm.
        await progress.wait_for(lambda: ctx.cluster.count("chaos_kv_fault") >= ctx.kv_faults_mark + count,
                                timeout=30.0)
        return FaultEvent(at, "data-plane", {kind: count})
    return inject


def calm(ctx: Ctx, event: FaultEvent) -> None:
    ctx.cluster.control()


def check_kv(ctx: Ctx, before: dict, after: dict) -> dict:
    injected = after["kv_flips"] - before["kv_flips"]
    caught = after["kv_caught"] - before["kv_caught"]
    drops = after["kv_drops"] - before["kv_drops"]
    failed = after["kv_failed_transfers"] - before["kv_failed_transfers"]
    audit = kv_fault_audit(ctx.cluster)
    return {"ok": audit["uncaught_flips"] == 0 and injected + drops > 0, "faults_injected": injected + drops,
            "flips_injected": injected, "bad_chunks_caught": caught, "drops_injected": drops,
            "transfers_failed_closed": failed, "audit": audit}


# -- partition -------------------------------------------------------------------------------
async def partition(ctx: Ctx, progress: Progress) -> FaultEvent:
    cluster = ctx.cluster
    await progress.wait_for(lambda: any(r.decode_node == PARTITIONED_NODE for r in progress.live())
                            or (cluster.kv_capacity(PARTITIONED_NODE) or {}).get("num_running"), timeout=10.0)
    broker = cluster.broker
    num_left = len(broker.find("node_left", node_id=PARTITIONED_NODE))
    num_joined = len(broker.find("node_joined", node_id=PARTITIONED_NODE))
    at = time.monotonic()
    cluster.cut()
    declared = await wait_event(broker, "node_left", num_left + 1, 10 * ctx.liveness_s + 5, node_id=PARTITIONED_NODE)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(cluster.heal)
    return FaultEvent(at, PARTITIONED_NODE, {"declared_lost": declared, "joined_before": num_joined,
                                             "bytes_swallowed": cluster.bytes_swallowed(),
                                             "kv_connections_before": cluster.num_kv_connections()},
                      healed_at=time.monotonic())


def check_partition(ctx: Ctx, before: dict, after: dict) -> dict:
    event = ctx.fault
    assert event is not None   # checks run only after an injected fault
    # KV reached the node only through its proxy (so the cut covered the data plane too).
    kv_through_proxy = event.details.get("kv_connections_before", 0) > 0
    ok = bool(event.details.get("declared_lost") and event.details.get("rejoined") and kv_through_proxy)
    return {"ok": ok, "kv_through_proxy": kv_through_proxy,
            **{k: event.details.get(k) for k in ("declared_lost", "rejoined", "bytes_swallowed")}}


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("kill-decode", "SIGKILL the decode node serving the most streams", kill_decode, repair=revive),
    Scenario("freeze-decode", "SIGSTOP a decode node until the broker declares it lost, then SIGCONT",
             freeze_decode, repair=after_thaw, check=check_freeze),
    Scenario("kill-prefill", "SIGKILL a prefill node mid-prefill (its prefills slowed to 1.5 s)", kill_prefill,
             repair=revive),
    Scenario("restart-broker", "SIGKILL the broker and restart it on its port", restart_broker,
             repair=broker_rejoined),
    Scenario("kill-broker", "SIGKILL one of two brokers mid-stream; its streams move to the other", kill_broker,
             repair=broker_back, check=check_kill_broker),
    Scenario("corrupt-kv", f"flip a byte in the next {NUM_KV_FLIPS} KV chunks each prefill node sends",
             kv_fault("flip", NUM_KV_FLIPS), repair=calm, check=check_kv, recovery_bound=False),
    Scenario("drop-kv", f"drop the next {NUM_KV_DROPS} KV chunks each prefill node sends",
             kv_fault("drop", NUM_KV_DROPS), repair=calm, check=check_kv, recovery_bound=False),
    Scenario("slow-consumer", "one SSE client stops reading (small receive window); the others stream on",
             client_scenarios.stall_begins, extras=client_scenarios.stalled_client,
             check=client_scenarios.check_stalled, recovery_bound=False),
    Scenario("abort-storm", "extra clients disconnect mid-stream at seeded random points",
             client_scenarios.storm_begins, extras=client_scenarios.storm, check=client_scenarios.check_storm,
             recovery_bound=False),
    Scenario("partition", f"cut {PARTITIONED_NODE} off from the broker and the prefill nodes' KV (TCP proxies "
             "swallow bytes), then heal",
             partition, repair=after_thaw, check=check_partition),
    Scenario("hostile-peer", "a peer speaks garbage and checksummed forgeries at the broker and the decode nodes' KV "
             "endpoints, and forges replies, cancels and kv_ready for live requests", hostile_scenario.inject,
             repair=hostile_scenario.repair, check=hostile_scenario.check, recovery_bound=False),
]}
SHORT = ("kill-decode", "kill-broker", "corrupt-kv", "abort-storm", "partition")   # the `make test` form
