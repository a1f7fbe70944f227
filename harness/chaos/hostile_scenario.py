"""The `hostile-peer` scenario: while the seeded workload streams, a hostile process
(harness/chaos/hostile.py) speaks garbage and forgeries at the broker and at every decode node's
KV endpoint; it passes when no accepted request is lost, every stream equals the fault-free one
(the runner's common checks) and this module's evidence holds.

Contract (the `Scenario` hooks of harness/chaos/scenarios.py):
- `inject(ctx, progress)`: as the pass begins, starts the hostile process and, beside it,
  keeps its ids file filled with the live request and transfer ids the nodes log (`kv_received`,
  `kv_arrived`, `prefill_done`); stops it (SIGTERM) once every request of the pass has ended, or
  after `HOSTILE_MAX_S`. Returns the FaultEvent with the hostile's counts.
- `repair(ctx, event)`: makes sure the hostile process is gone (idempotent).
- `check(ctx, before, after) -> dict`: `ok` when the hostile sent messages of every family
  (unregistered, from its sessions, at the KV endpoints), aimed forgeries at live requests, the
  broker refused some of it (`message_rejected`), and the broker, the gateway and every node
  outlived it under the same process id.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.chaos.passes import FaultEvent, Progress
from harness.cluster_procs import Proc

HOSTILE_MAX_S = 45.0
ID_EVENTS = {"kv_received": ("request_id", "transfer_id"), "kv_arrived": ("request_id", "transfer_id"),
             "prefill_done": ("decode_request_id", None)}
_RUNNING: dict[int, dict[str, Any]] = {}   # id(ctx) -> the hostile run of that scenario pass


def live_ids(cluster: Any) -> dict[str, list[str]]:
    """Request and transfer ids the nodes logged, most recent last (at most 64 each)."""
    requests, transfers = [], []
    for proc in cluster.processes():
        for event in list(proc.events):
            request_key, transfer_key = ID_EVENTS.get(event.get("event"), (None, None))
            if request_key and isinstance(event.get(request_key), str):
                requests.append((event["seen_at"], event[request_key]))
            if transfer_key and isinstance(event.get(transfer_key), str):
                transfers.append((event["seen_at"], event[transfer_key]))
    return {"request_ids": [i for _, i in sorted(requests)][-64:], "transfer_ids": [i for _, i in sorted(transfers)][-64:]}


def write_ids(path: Path, ids: dict[str, list[str]]) -> None:
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(ids))
    os.replace(partial, path)


def start_hostile(cluster: Any, folder: Path, seed: int) -> Proc:
    joined = {e["node_id"]: e.get("data_endpoint") for e in cluster.broker.find("node_joined")}
    decode_ids = [n for n in cluster.decode_ids() if cluster.nodes[n].alive]
    args = [sys.executable, "-m", "harness.chaos.hostile", "--broker", cluster.broker_endpoint.split(",")[0],
            "--ids", str(folder / "ids.json"), "--summary", str(folder / "summary.json"), "--seed", str(seed),
            "--seconds", str(HOSTILE_MAX_S + 15)]
    for node_id in decode_ids:
        args += ["--node", node_id] + (["--kv", joined[node_id]] if joined.get(node_id) else [])
    return Proc(args)


def pids(cluster: Any) -> dict[str, int]:
    procs = {"broker": cluster.broker, **({"gateway": cluster.gateway} if cluster.gateway else {}), **cluster.nodes}
    return {name: proc.process.pid for name, proc in procs.items() if proc.alive}


async def inject(ctx: Any, progress: Progress) -> FaultEvent:
    cluster = ctx.cluster
    folder = Path(tempfile.mkdtemp(prefix="pdbus-hostile-"))
    write_ids(folder / "ids.json", live_ids(cluster))
    run = {"proc": start_hostile(cluster, folder, ctx.rng.randrange(2**31)), "folder": folder, "pids": pids(cluster),
           "rejected_before": len(cluster.broker.find("message_rejected"))}
    _RUNNING[id(ctx)] = run
    at = time.monotonic()

    def finished() -> bool:
        write_ids(folder / "ids.json", live_ids(cluster))
        return sum(r.finished_at is not None for r in progress.records) >= len(ctx.specs)

    await progress.wait_for(finished, timeout=HOSTILE_MAX_S, interval=0.1)
    counts = await asyncio.to_thread(stop, run)
    return FaultEvent(at, "hostile-peer", {"counts": counts, "ran_s": round(time.monotonic() - at, 1)},
                      healed_at=time.monotonic())


def stop(run: dict[str, Any]) -> dict[str, int]:
    """Stop the hostile process (SIGTERM: it closes its sessions and writes its counts); its counts."""
    proc = run["proc"]
    if proc.alive:
        proc.stop(timeout=10)
    run["exit_code"] = proc.process.returncode
    try:
        return json.loads((run["folder"] / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def repair(ctx: Any, event: FaultEvent) -> None:
    run = _RUNNING.get(id(ctx))
    if run is not None:
        stop(run)


def check(ctx: Any, before: dict, after: dict) -> dict:
    run = _RUNNING.pop(id(ctx), {})
    counts = (ctx.fault.details.get("counts") if ctx.fault else None) or {}
    sent = {family: sum(v for k, v in counts.items() if k.startswith(f"sent.{family}"))
            for family in ("broker", "session", "kv")}
    live = sum(v for k, v in counts.items() if k.startswith("forged.live."))
    rejected = len(ctx.cluster.broker.find("message_rejected")) - run.get("rejected_before", 0)
    now = pids(ctx.cluster)
    survived = {name: now.get(name) == pid for name, pid in run.get("pids", {}).items()}
    ok = all(sent.values()) and live > 0 and rejected > 0 and bool(survived) and all(survived.values())
    return {"ok": ok, "sent": sent, "forged_at_live_requests": live, "broker_rejected": rejected,
            "survived": survived, "hostile_exit_code": run.get("exit_code")}
