"""The checks every scenario shares, as pure functions over records and log counts.

Contract:
- `snapshot(cluster) -> dict`: counters read from the processes' JSON logs (KV faults injected and
  caught by the checksums, failed-closed transfers, stalled consumers cut off, streams cancelled),
  taken before and after a pass; the scenario checks use the differences.
- `compare(records, reference) -> Comparison`: per request, the same tokens as the fault-free pass?
  Token ids when both passes have them (ws, bus), otherwise text and token count (sse: the OpenAI
  chunks carry no ids). `first_divergence` says at which token a stream first differed.
- `kv_fault_audit(cluster)`: whether any flipped KV chunk could have been decoded (must be 0).
- `rss_grown(before, after, slack_mib, slack_ratio, held_mib)`: the nodes whose resident memory
  grew past max(slack_mib, slack_ratio x before) plus what they hold more by design (`held_mib`:
  a decode node's cached sessions, KV store and kept buffer, `kv_mib_cached` + `kv_mib_slots` +
  `kv_mib_buffers`) over a
  pass; `before`/`after` map node id -> (pid, MiB), so a node killed and revived (a new process)
  is not compared.
- `latency(records)`: p50/p99 of whole-request latency; `recovery(records, fault)`: per stream hit
  by the fault (live at the fault and served with a failure, or every live stream for the
  broker), the time from the fault to the first token of the resumed stream (`resumed_at`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent

TRANSFER_ENDS = ("kv_received", "kv_receive_failed")   # the KV receiver's log of every finished transfer


def snapshot(cluster: Any) -> dict[str, int]:
    checked = [e for p in cluster.processes() for name in TRANSFER_ENDS for e in p.find(name)]
    gateway = cluster.gateway
    return {
        "kv_flips": cluster.count("chaos_kv_fault", kind="flip"),
        "kv_drops": cluster.count("chaos_kv_fault", kind="drop"),
        "kv_caught": sum(e.get("checksum_failures", 0) + e.get("rejected", 0) for e in checked),
        "kv_failed_transfers": sum(1 for e in checked if not e.get("ok")),
        "gateway_stalled": len(gateway.find("access", outcome="stalled")) if gateway else 0,
        "cancels": cluster.count("decode_cancelled") + cluster.count("prefill_cancelled"),
    }


def kv_fault_audit(cluster: Any) -> dict[str, int]:
    """Could any flipped KV chunk have been decoded? Per transfer that had flips (the sender hook
    logs each with its transfer id): it failed closed or never finished at the receiver (nothing
    decoded), or it was verified only after its checksums caught at least as many bad chunks as
    were flipped in it. Flips in a header too damaged to name its transfer are dropped by the
    receiver undecoded (`kv_undecodable`) and resent; they cover a shortfall. Cumulative
    over the cluster's life."""
    events = [e for p in cluster.processes() for e in p.events]
    flips = Counter(e["transfer_id"] for e in events if e.get("event") == "chaos_kv_fault" and e.get("kind") == "flip")
    checked = {e["transfer_id"]: e for e in events if e.get("event") in TRANSFER_ENDS}
    undecodable = sum(1 for e in events if e.get("event") == "kv_undecodable")
    failed_closed = verified = shortfall = 0
    for transfer_id, num_flips in flips.items():
        result = checked.get(transfer_id)
        if result is None or not result["ok"]:
            failed_closed += 1
            continue
        verified += 1
        shortfall += max(0, num_flips - result["checksum_failures"] - result["rejected"])
    return {"transfers_with_flips": len(flips), "failed_closed": failed_closed, "verified_after_resend": verified,
            "undecodable_headers": undecodable, "uncaught_flips": max(0, shortfall - undecodable)}


def rss_grown(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]], slack_mib: float,
              slack_ratio: float, held_mib: dict[str, float] | None = None) -> dict[str, float]:
    grown = {}
    for node_id, (pid, mib) in before.items():
        if node_id in after and after[node_id][0] == pid:
            growth = after[node_id][1] - mib - max(0.0, (held_mib or {}).get(node_id, 0.0))
            if growth > max(slack_mib, slack_ratio * mib):
                grown[node_id] = round(growth, 1)
    return grown


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[rank]


def latency(records: list[StreamRecord]) -> dict[str, float | None]:
    values = [r.latency_s for r in records if r.ok and r.latency_s is not None]
    return {"p50_s": _round(percentile(values, 50)), "p99_s": _round(percentile(values, 99))}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class Comparison:
    exact_ids: bool                         # token ids compared (else text + count)
    num_compared: int = 0
    num_identical: int = 0
    diverged: list[dict[str, Any]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.num_compared > 0 and self.num_identical == self.num_compared


def first_divergence(ours: Sequence[object], theirs: Sequence[object]) -> int | None:
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return i
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def compare(records: list[StreamRecord], reference: dict[str, StreamRecord]) -> Comparison:
    exact = all(r.token_ids is not None and reference[r.name].token_ids is not None for r in records)
    comparison = Comparison(exact)
    for record in records:
        if not record.ok:
            continue
        expected = reference[record.name]
        comparison.num_compared += 1
        if exact:
            assert record.token_ids is not None and expected.token_ids is not None   # what `exact` means
            where = first_divergence(record.token_ids, expected.token_ids)
        else:
            where = first_divergence(record.text, expected.text)
            if where is None and record.num_completion_tokens != expected.num_completion_tokens:
                where = -1   # same text, different token count
        if where is None:
            comparison.num_identical += 1
        else:
            comparison.diverged.append({"name": record.name, "at": where, "failed_over": bool(
                (record.pdbus or {}).get("failures"))})
    return comparison


def hit_by(record: StreamRecord, fault: FaultEvent) -> bool:
    if not record.live_at(fault.at) or record.stalled or record.aborted:
        return False
    return fault.target == "broker" or bool((record.pdbus or {}).get("failures"))


def resumed_at(token_times: list[float], fault_at: float) -> float | None:
    """When the stream resumed: the token that ends its longest silence after the fault (tokens
    already in flight can still trickle in right after it, e.g. through a cut link's buffers)."""
    after = [t for t in token_times if t > fault_at]
    if not after:
        return None
    edges = [fault_at, *after]
    gaps = [(b - a, b) for a, b in zip(edges, edges[1:], strict=False)]
    return max(gaps)[1]


def recovery(records: list[StreamRecord], fault: FaultEvent | None) -> list[float]:
    """Per stream the fault hit: fault -> first token of the resumed stream."""
    if fault is None:
        return []
    times = []
    for record in records:
        if hit_by(record, fault) and (resumed := resumed_at(record.token_times, fault.at)) is not None:
            times.append(resumed - fault.at)
    return times
