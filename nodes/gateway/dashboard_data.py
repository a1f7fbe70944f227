"""The dashboard's data (docs/API.md, "Dashboard"), pure: no sockets, no clock of its own.

Contract: `window = DashboardWindow(window_s=300, max_events=20, seed=0)`; what feeds it:
- `observe_request(endpoint, outcome, now)`: every request's outcome (GatewayMetrics.observe_request);
- `observe_stream(trace, usage, token_times, started, ended)`: every started request when it ends,
  the same values GatewayMetrics.observe_stream turns into histograms (TTFT, TPOT, ITL, KV
  transfer reports, failovers and failures);
- `observe_broker(stats, now)`: the broker's stats answer, or None (dashboard_nodes.NodeTable);
and `snapshot(now, wall) -> dict`, JSON-ready: nodes, queues, a summary, per-second series over
the last `window_s` seconds and the recent events. Times are the gateway's monotonic clock; `wall`
(time.time() at `now`) only turns them into Unix seconds for the page.

Samples live in one bucket per second, dropped after `window_s`. TTFT, TPOT and ITL are counted
in the second the request ended (as the histograms observe them), each bucket keeping a uniform
reservoir of at most `SAMPLES_PER_SECOND` values per measure so memory and the cost of a snapshot
stay bounded under any load; completion tokens are counted in the second they reached the
gateway, so the last seconds' tokens/s fill in as the streams in flight finish. The series' latency
percentiles are over a trailing `SMOOTH_S` seconds (single seconds hold too few requests to say
much); the summary's are over the whole window. Events (failovers, prefill retries, other
failures, nodes lost and joined, KV transfers) are kept in two bounded lists, newest first.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from nodes.gateway.dashboard_nodes import NodeEvent, NodeTable, number

SAMPLES_PER_SECOND = 64
SMOOTH_S = 10
MIN_SPAN_S = 60
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
LATENCIES = ("ttft", "tpot", "itl")


class Reservoir:
    """At most `size` values, a uniform sample of all `add`ed (Vitter's algorithm R)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size, self.rng, self.num_seen = size, rng, 0
        self.values: list[float] = []

    def add(self, value: float) -> None:
        self.num_seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
        elif (slot := self.rng.randrange(self.num_seen)) < self.size:
            self.values[slot] = value


def quantiles(values: list[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99 (None for no values)."""
    ordered = sorted(values)
    if not ordered:
        return {name: None for name, _ in QUANTILES}
    return {name: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for name, q in QUANTILES}


@dataclass
class Second:
    """What happened in one second of the gateway's clock."""

    latency: dict[str, Reservoir]
    num_tokens: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    num_failovers: int = 0
    kv_raw_bytes: float = 0.0
    kv_wire_bytes: float = 0.0
    num_transfers: int = 0
    broker: dict[str, float | None] | None = None   # the last broker sample taken in this second


class DashboardWindow:
    def __init__(self, window_s: int = 300, max_events: int = 20, seed: int = 0) -> None:
        self.window_s = window_s
        self.rng = random.Random(seed)   # reservoirs only: seeded so a test sees the same sample
        self.seconds: dict[int, Second] = {}
        self.first_second = 2**62   # the first second anything was observed in
        self.nodes = NodeTable()
        self.incidents: deque[dict[str, Any]] = deque(maxlen=max_events)
        self.transfers: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._smoothed: dict[int, dict[str, dict[str, float | None]]] = {}   # seconds whose inputs are final

    # -- feeding -------------------------------------------------------------------------------

    def _second(self, at: float) -> Second:
        key = int(at // 1)
        self.first_second = min(self.first_second, key)
        if (bucket := self.seconds.get(key)) is None:
            reservoirs = {name: Reservoir(SAMPLES_PER_SECOND, self.rng) for name in LATENCIES}
            bucket = self.seconds[key] = Second(reservoirs)
        return bucket

    def observe_request(self, endpoint: str, outcome: str, now: float) -> None:
        outcomes = self._second(now).outcomes
        outcomes[str(outcome)] = outcomes.get(str(outcome), 0) + 1

    def observe_stream(self, trace: Any, usage: dict[str, int], token_times: list[float], started: float,
                       ended: float) -> None:
        bucket = self._second(ended)
        if token_times:
            bucket.latency["ttft"].add(token_times[0] - started)
            gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
            for gap in gaps:
                bucket.latency["itl"].add(gap)
            if gaps:
                bucket.latency["tpot"].add(sum(gaps) / len(gaps))
        for at in token_times:
            if ended - at <= self.window_s:
                self._second(at).num_tokens += 1
        for key in range(int(ended) - SMOOTH_S, int(ended) + SMOOTH_S + 1):
            self._smoothed.pop(key, None)
        self._observe_trace(trace, bucket, ended)

    def _observe_trace(self, trace: Any, bucket: Second, at: float) -> None:
        request_id = str(getattr(trace, "request_id", ""))[:64]
        num_failovers = number(getattr(trace, "num_failovers", 0)) or 0
        bucket.num_failovers += int(num_failovers)
        for failure in getattr(trace, "failures", ()):
            code, _, node_id = str(failure).partition("@")
            # A decode failure in a request that failed over is what the failover followed.
            kind = "prefill_retry" if code.startswith("prefill_") else "failover" if num_failovers else "failure"
            self.incidents.appendleft({"at": at, "kind": kind, "code": code[:64], "node": node_id[:128],
                                       "request_id": request_id, "decode_nodes": _names(trace, "decode_node_ids")})
        transfers = [t for t in getattr(trace, "kv_transfers", ()) if isinstance(t, dict)]
        prefills, decodes = _names(trace, "prefill_node_ids"), _names(trace, "decode_node_ids")
        for index, transfer in enumerate(transfers):
            raw, wire = number(transfer.get("raw_bytes")) or 0.0, number(transfer.get("wire_bytes")) or 0.0
            bucket.kv_raw_bytes += raw
            bucket.kv_wire_bytes += wire
            bucket.num_transfers += 1
            self.transfers.appendleft({
                "at": at, "request_id": request_id, "raw_bytes": raw, "wire_bytes": wire,
                "seconds": number(transfer.get("seconds")), "mode": str(transfer.get("mode", ""))[:32],
                "compression": str(transfer.get("compression", ""))[:32],
                # The report does not name its nodes: a transfer per prefill (the usual case) pairs
                # by position, else the request's last nodes are the best guess.
                "prefill_node": _pick(prefills, index, len(transfers)),
                "decode_node": _pick(decodes, index, len(transfers))})

    def observe_broker(self, stats: dict[str, Any] | None, now: float) -> None:
        for event in self.nodes.update(stats, now):
            self._node_event(event)
        if stats is None:
            return
        totals = self.nodes.totals()
        kv_used = totals.kv_used
        self._second(now).broker = {"queued": totals.num_queued, "running": totals.num_running,
                                    "kv_used": None if kv_used is None else round(kv_used, 4)}

    def _node_event(self, event: NodeEvent) -> None:
        self.incidents.appendleft({"at": event.at, "kind": event.kind, "code": "", "node": event.node_id,
                                   "role": event.role, "request_id": "", "decode_nodes": []})

    # -- reading -------------------------------------------------------------------------------

    def _prune(self, now: float) -> None:
        oldest = int(now) - self.window_s
        for key in [key for key in self.seconds if key <= oldest]:
            del self.seconds[key]
        for key in [key for key in self._smoothed if key <= oldest]:
            del self._smoothed[key]

    def snapshot(self, now: float, wall: float) -> dict[str, Any]:
        self._prune(now)
        offset = wall - now
        current = int(now)
        # From the first second anything was seen (at least MIN_SPAN_S back): a young gateway's
        # charts are not five minutes of zeros.
        first = max(current - self.window_s + 1, min(self.first_second, current - MIN_SPAN_S + 1))
        keys = list(range(first, current + 1))
        return {"type": "snapshot", "time": round(wall, 3), "window_s": self.window_s,
                "broker": {"ok": self.nodes.broker_ok, "nodes_by_role": self.nodes.roles,
                           "queued_by_service": self.nodes.queued, "num_routes": self.nodes.num_routes},
                "nodes": self.nodes.rows(now), "summary": self._summary(keys, current),
                "series": self._series(keys, offset, current),
                "incidents": [_timed(event, offset) for event in self.incidents],
                "transfers": [_timed(event, offset) for event in self.transfers]}

    def _summary(self, keys: list[int], current: int) -> dict[str, Any]:
        buckets = [self.seconds[key] for key in keys if key in self.seconds]
        recent = [self.seconds[key] for key in range(current - SMOOTH_S, current) if key in self.seconds]
        outcomes: dict[str, int] = {}
        for bucket in buckets:
            for outcome, count in bucket.outcomes.items():
                outcomes[outcome] = outcomes.get(outcome, 0) + count
        summary: dict[str, Any] = {}
        for name in LATENCIES:
            found = quantiles([value for bucket in buckets for value in bucket.latency[name].values])
            summary[name] = {**{q: _rounded(v) for q, v in found.items()},
                             "count": sum(bucket.latency[name].num_seen for bucket in buckets)}
        return summary | {
            "tokens_per_s": round(sum(b.num_tokens for b in recent) / SMOOTH_S, 2),
            "requests": outcomes, "num_failovers": sum(b.num_failovers for b in buckets),
            "kv_raw_bytes": sum(b.kv_raw_bytes for b in buckets),
            "kv_wire_bytes": sum(b.kv_wire_bytes for b in buckets),
            "num_transfers": sum(b.num_transfers for b in buckets)}

    def _series(self, keys: list[int], offset: float, current: int) -> dict[str, list]:
        points = [self._point(key, current) for key in keys]
        return {"time": [round(key + offset, 3) for key in keys]} | {
            column: [point[column] for point in points] for column in points[0]}

    def _point(self, key: int, current: int) -> dict[str, Any]:
        bucket = self.seconds.get(key) or Second({})
        broker = bucket.broker or {}
        # The current second's counts are partial: a gap, not a dip at the charts' right edge.
        done = key < current
        point: dict[str, Any] = {
            "tokens_per_s": bucket.num_tokens if done else None,
            "requests_per_s": sum(bucket.outcomes.values()) if done else None,
            "errors_per_s": sum(n for o, n in bucket.outcomes.items() if o != "ok") if done else None,
            "failovers": bucket.num_failovers,
            "kv_wire_bytes_per_s": bucket.kv_wire_bytes if done else None,
            "kv_raw_bytes_per_s": bucket.kv_raw_bytes if done else None,
            # No broker sample in a second (nobody watched, or it did not answer) is a gap, not a zero.
            "queued": broker.get("queued"), "running": broker.get("running"), "kv_used": broker.get("kv_used")}
        for name, values in self._smoothed_latency(key, current).items():
            point[f"{name}_p50"], point[f"{name}_p99"] = _rounded(values["p50"]), _rounded(values["p99"])
        return point

    def _smoothed_latency(self, key: int, current: int) -> dict[str, dict[str, float | None]]:
        """p50/p99 over the `SMOOTH_S` seconds up to `key`; cached once those seconds are past, since
        samples land in the second a request ends (observe_stream drops the cache it touches)."""
        if (cached := self._smoothed.get(key)) is not None:
            return cached
        buckets = [self.seconds[k] for k in range(key - SMOOTH_S + 1, key + 1) if k in self.seconds]
        point = {name: quantiles([v for b in buckets for v in b.latency[name].values]) for name in LATENCIES}
        if key < current:
            self._smoothed[key] = point
        return point


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


def _names(trace: Any, attribute: str) -> list[str]:
    return [str(name)[:128] for name in getattr(trace, attribute, ()) or ()][:16]


def _pick(names: list[str], index: int, num_transfers: int) -> str:
    if not names:
        return ""
    return names[index] if len(names) == num_transfers else names[-1]


def _timed(event: dict[str, Any], offset: float) -> dict[str, Any]:
    """An event for the page: its monotonic `at` as Unix seconds `time`."""
    return {**{k: v for k, v in event.items() if k != "at"}, "time": round(event["at"] + offset, 3)}
