"""Where a scenario's recovery time went: every process's log events around the fault, on one
clock, next to the moments the hit streams resumed.

Contract: `timeline(cluster, fault, records, before_s=0.5, after_s=8.0) -> list[dict]` returns the
events seen from `fault.at - before_s` to `fault.at + after_s` (per event: `t` seconds after the
fault, by the harness's clock when the line arrived; `process`; `event`; the fields that locate it),
oldest first, plus one `stream_resumed` entry per stream the fault hit. Periodic capacity reports
are left out (they would drown the rest). The runner stores it in each row's JSON as `timeline`.
"""

from __future__ import annotations

from typing import Any

from harness.chaos.checks import hit_by, resumed_at
from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent

NOISE = {"capacity_updated", "capacity_changed", "access"}
KEPT_FIELDS = ("node_id", "request_id", "decode_request_id", "reason", "silent_for_s", "lost_request_ids",
               "stage", "transfer_id", "request_ids", "code", "error", "num_inflight", "timings", "kind")


def processes_by_name(cluster: Any) -> list[tuple[str, Any]]:
    named = [(node_id, proc) for node_id, proc in [*cluster.dead, *cluster.nodes.items()]]
    named += [("broker", proc) for proc in [*cluster.old_brokers, cluster.broker] if proc is not None]
    if cluster.gateway is not None:
        named.append(("gateway", cluster.gateway))
    return named


def timeline(cluster: Any, fault: FaultEvent | None, records: list[StreamRecord], before_s: float = 0.5,
             after_s: float = 8.0) -> list[dict[str, Any]]:
    if fault is None:
        return []
    start, end = fault.at - before_s, fault.at + after_s
    entries = []
    for name, proc in processes_by_name(cluster):
        for event in list(proc.events):
            seen = event.get("seen_at", 0.0)
            if start <= seen <= end and event.get("event") not in NOISE:
                fields = {k: event[k] for k in KEPT_FIELDS if k in event}
                entries.append({"t": round(seen - fault.at, 3), "process": name, "event": event.get("event"), **fields})
    for record in records:
        if hit_by(record, fault) and (resumed := resumed_at(record.token_times, fault.at)) is not None:
            entries.append({"t": round(resumed - fault.at, 3), "process": "client", "event": "stream_resumed",
                            "name": record.name, "decode_node": record.decode_node,
                            "failures": (record.pdbus or {}).get("failures")})
    return sorted(entries, key=lambda e: e["t"])
