"""Run chaos scenarios against one real local cluster and judge them.

Contract: `run_chaos(ChaosOptions(...)) -> dict` (the run: options, the fault-free reference pass,
one row per scenario with `ok` and the evidence) and `main(options) -> int` (prints the table,
writes results/chaos-*.json, 0 only when every scenario passed). Flow: start a `ChaosCluster`
(broker, prefill and decode nodes, the gateway unless the driver is `bus`), warm it up, stream
the seeded workload once fault-free (the reference), then per scenario: stream it again while the
scenario's fault hits, repair the cluster (revive, heal, thaw), wait for every decode node's KV
to be back to baseline, and check. A scenario passes when no request was lost, every stream
equals the reference (raw KV; with int8 the divergences are reported, not failed), the KV is
back to baseline, no warm node (one that served a pass before: a fresh process grows while it
warms up) that lived through the pass grew its resident memory past max(`rss_slack_mib`,
`rss_slack_ratio` x its size before the pass) beyond what its cached sessions, its KV store and its
kept buffer grew (`kv_mib_cached`, `kv_mib_slots`, `kv_mib_buffers`), the scenario's own
evidence holds, and the recovery time of the streams the
fault hit stays within the bound: liveness window + one heartbeat + the client's retry delay +
one re-prefill (the reference pass's p99 time to first token).
"""

from __future__ import annotations

import asyncio
import random
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.chaos import checks
from harness.chaos.chaos_cluster import ChaosCluster
from harness.chaos.chaos_report import render_table, write_json
from harness.chaos.chaos_workload import build_workload, vocab_size_of
from harness.chaos.drivers import StreamRecord, make_driver
from harness.chaos.passes import FaultEvent, run_pass
from harness.chaos.scenarios import PARTITIONED_NODE, SCENARIOS, SHORT, Ctx, Scenario
from harness.chaos.timeline import timeline

RETRY_DELAY_S = 0.2   # ClusterClient's default pause before a retry


@dataclass
class ChaosOptions:
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    model: str = "tiny"
    kv: str = "raw"
    dtype: str = "float32"   # the exact-comparison dtype; bfloat16 is the product's default engine
    driver: str = "sse"
    num_requests: int = 8
    concurrency: int = 4
    prompt_tokens: int = 64
    max_tokens: int = 48
    step_delay_ms: int = 20      # test-only decode slowdown so faults land mid-stream
    seed: int = 0
    num_prefill: int = 2
    num_decode: int = 2
    results_dir: str | None = "results"
    verbose: bool = True
    enforce_recovery_bound: bool = True   # the short test form reports it but asserts no timing
    rss_slack_mib: float = 128.0          # growth over a pass that still counts as "back to baseline"
    rss_slack_ratio: float = 0.10


def _held_mib(capacity: dict | None) -> float:
    """Memory a decode node holds by design: cached sessions, its KV store and the received-KV
    buffer it keeps while quiet."""
    capacity = capacity or {}
    return sum(capacity.get(key, 0.0) for key in ("kv_mib_cached", "kv_mib_slots", "kv_mib_buffers"))


def short_options(**overrides: Any) -> ChaosOptions:
    """The `make test` form: tiny model, fp32, raw KV, greedy, a small workload."""
    values = {"scenarios": list(SHORT), "num_requests": 6, "concurrency": 3,
              "prompt_tokens": 32, "max_tokens": 32, "step_delay_ms": 25, "results_dir": None, "verbose": False,
              "driver": "ws", "enforce_recovery_bound": False}
    return ChaosOptions(**{**values, **overrides})


def must_be_identical(options: ChaosOptions) -> bool:
    """Lossless KV in float32 reproduces every stream exactly; int8 KV, or bfloat16 (whose results
    move with the batch shape), legitimately changes some greedy continuations: those are reported."""
    return options.kv == "raw" and options.dtype == "float32"


def say(options: ChaosOptions, text: str) -> None:
    if options.verbose:
        print(text, flush=True)


def build_cluster(options: ChaosOptions) -> ChaosCluster:
    return ChaosCluster(num_prefill=options.num_prefill, num_decode=options.num_decode, model=options.model,
                        kv_quant=options.kv, gateway=options.driver != "bus",
                        # Every pass sends the same prompts: a decode node holds each one's leading
                        # blocks after the first, and would prefill a short rest itself. With no
                        # local rest every request still takes a prefill node and a KV transfer (of
                        # the rest: the held-prefix path is exercised too), so every fault hits.
                        settings={"engine": {"dtype": options.dtype}, "scheduler": {"local_suffix_tokens": 0}},
                        proxied=PARTITIONED_NODE if "partition" in options.scenarios else None,
                        num_brokers=2 if "kill-broker" in options.scenarios else 1,
                        extra_args={"decode": ["--test-step-delay-ms", str(options.step_delay_ms)]})


def stream_pass(cluster: ChaosCluster, options: ChaosOptions, specs, fault=None, extras=(), driver=None):
    driver = driver or new_driver(cluster, options)
    return asyncio.run(run_pass(driver, specs, options.concurrency, fault, extras))


def new_driver(cluster: ChaosCluster, options: ChaosOptions) -> Any:
    return make_driver(options.driver, gateway_url=cluster.gateway_url, broker_endpoint=cluster.broker_endpoint)


def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    unknown = [s for s in options.scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    specs = build_workload(options.seed, options.num_requests, options.prompt_tokens, options.max_tokens,
                           vocab_size_of(options.model))
    started = time.monotonic()
    with build_cluster(options) as cluster:
        say(options, f"cluster up in {time.monotonic() - started:.1f}s; warm-up, then the reference pass "
                     f"({len(specs)} requests)")
        stream_pass(cluster, options, specs[: options.concurrency])   # one-time costs stay out of the figures
        reference = stream_pass(cluster, options, specs)
        lost = [r.name for r in reference.records if not r.ok]
        if lost:
            raise RuntimeError(f"the fault-free reference pass lost {lost}: "
                               + "; ".join(str(r.error) for r in reference.records if not r.ok))
        by_name = {r.name: r for r in reference.records}
        ttft = [r.token_times[0] - r.started_at for r in reference.records if r.token_times]
        beat = cluster.settings["heartbeat"]
        liveness_s = beat["interval_ms"] * beat["liveness"] / 1000
        bound = liveness_s + beat["interval_ms"] / 1000 + RETRY_DELAY_S + (checks.percentile(ttft, 99) or 0.0)
        rows, warm_pids = [], set(cluster.node_pids().values())
        for index, name in enumerate(options.scenarios):
            say(options, f"scenario {name} ...")
            ctx = Ctx(cluster, new_driver(cluster, options), random.Random(options.seed * 1000 + index), specs,
                      liveness_s, stall_hold_s=60.0 if options.model == "tiny" else 240.0)
            row = run_scenario(SCENARIOS[name], ctx, options, by_name, bound, warm_pids)
            row["latency_fault_free"] = checks.latency(reference.records)
            rows.append(row)
            say(options, f"  {'ok' if row['ok'] else 'FAILED'} in {row['seconds']:.1f}s"
                + (f": {'; '.join(row['problems'])}" if row["problems"] else ""))
    return {"options": asdict(options), "reference": {"latency": checks.latency(reference.records),
                                                       "ttft_p99_s": checks.percentile(ttft, 99),
                                                       "records": [r.to_json() for r in reference.records]},
            "recovery_bound_s": round(bound, 3), "rows": rows, "seconds": round(time.monotonic() - started, 1)}


def run_scenario(scenario: Scenario, ctx: Ctx, options: ChaosOptions, reference: dict[str, StreamRecord],
                 bound: float, warm_pids: set[int]) -> dict[str, Any]:
    """One scenario's pass and checks; `warm_pids` (the processes that served a pass before) grows."""
    cluster, started = ctx.cluster, time.monotonic()
    problems: list[str] = []
    idle_before = cluster.wait_kv_idle(30)
    if not all(idle_before.values()):
        problems.append(f"KV not at baseline before the fault: {idle_before}")
    ctx.kv_faults_mark = cluster.count("chaos_kv_fault")
    before, rss_before, pids_before = checks.snapshot(cluster), cluster.rss_mib(), cluster.node_pids()
    cached_before = {n: _held_mib(cluster.kv_capacity(n)) for n in cluster.decode_ids()}

    async def fault(progress) -> FaultEvent:
        ctx.fault = await scenario.inject(ctx, progress)
        return ctx.fault

    records, extras = [], []
    try:
        result = stream_pass(cluster, options, ctx.specs, fault, scenario.extras(ctx) if scenario.extras else (),
                             driver=ctx.driver)
        records, extras, ctx.fault = result.records, result.extras, result.fault
    except Exception as exc:   # a harness or cluster failure fails this scenario, never the run
        problems.append(f"pass raised {type(exc).__name__}: {exc}")
        traceback.print_exc()
    try:
        if scenario.repair and ctx.fault is not None:
            scenario.repair(ctx, ctx.fault)
    except Exception as exc:
        problems.append(f"repair raised {type(exc).__name__}: {exc}")
    cluster.thaw_all()
    idle_after = cluster.wait_kv_idle(30)
    after, rss_after, pids_after = checks.snapshot(cluster), cluster.rss_mib(), cluster.node_pids()
    held = {n: _held_mib(cluster.kv_capacity(n)) - mib for n, mib in cached_before.items()}
    rss_grown = checks.rss_grown(
        {n: (pids_before.get(n), mib) for n, mib in rss_before.items() if pids_before.get(n) in warm_pids},
        {n: (pids_after.get(n), mib) for n, mib in rss_after.items()}, options.rss_slack_mib, options.rss_slack_ratio,
        held)
    warm_pids.update(pids_before.values())
    evidence = scenario.check(ctx, before, after) if scenario.check and ctx.fault else {"ok": ctx.fault is not None}
    comparison = checks.compare(records, reference)
    recovery = checks.recovery(records, ctx.fault)
    recovery_p99 = checks.percentile(recovery, 99)
    lost = [r for r in records if not r.ok]
    stalled = any("stalled" in str((r.pdbus or {}).get("failures")) for r in records)   # a longer timeline
    problems += [f"{r.name} lost: {r.error}" for r in lost]
    problems += [f"{r.name} (extra client) ended badly: {r.error}" for r in extras if not (r.ok or r.aborted)]
    if not comparison.identical and must_be_identical(options):
        problems.append(f"{len(comparison.diverged)} streams differ from the fault-free pass: {comparison.diverged}")
    if not all(idle_after.values()):
        problems.append(f"KV not back to baseline: {idle_after}")
    if rss_grown:
        problems.append(f"resident memory not back near its baseline (MiB grown): {rss_grown}")
    if not evidence.get("ok"):
        problems.append(f"scenario evidence failed: {evidence}")
    if scenario.recovery_bound:
        if not recovery:
            problems.append("no stream was hit by the fault (nothing to recover)")
        elif recovery_p99 is not None and recovery_p99 > bound and options.enforce_recovery_bound:
            problems.append(f"recovery p99 {recovery_p99:.2f}s over the bound {bound:.2f}s")
    return {
        "scenario": scenario.name, "summary": scenario.summary, "ok": not problems, "problems": problems,
        "num_ok": len(records) - len(lost), "num_failed": len(lost), "num_extra_clients": len(extras),
        "tokens": {"identical": comparison.identical, "exact_ids": comparison.exact_ids,
                   "num_compared": comparison.num_compared, "num_identical": comparison.num_identical,
                   "diverged": comparison.diverged},
        "latency_faulted": checks.latency(records),
        "recovery_p99_s": None if recovery_p99 is None else round(recovery_p99, 3),
        "recovery_s": [round(t, 3) for t in recovery], "recovery_bound_s": round(bound, 3) if scenario.recovery_bound else None,
        "fault": None if ctx.fault is None else {"target": ctx.fault.target, "details": ctx.fault.details},
        "evidence": evidence, "kv_idle_after": idle_after, "rss_mib_before": rss_before, "rss_mib_after": rss_after,
        "rss_grown_mib": rss_grown,
        "records": [r.to_json() for r in records], "extras": [r.to_json() for r in extras],
        "timeline": timeline(cluster, ctx.fault, records, after_s=40.0 if stalled else 8.0),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(options: ChaosOptions) -> int:
    run = run_chaos(options)
    print(render_table(run["rows"]))
    print(f"recovery bound {run['recovery_bound_s']}s; {len(run['rows'])} scenarios in {run['seconds']}s; "
          f"driver {options.driver}, model {options.model}, {options.dtype}, KV {options.kv}")
    if options.results_dir:
        print(f"written: {write_json(run, options.results_dir)}")
    return 0 if all(row["ok"] for row in run["rows"]) else 1
