"""The gateway's Prometheus metrics (prometheus-client), in a registry of its own.

Contract: `GatewayMetrics()`; `observe_request(endpoint, outcome)`, `observe_stream(...)` at the end
of every generation (TTFT, TPOT, inter-token latency, end-to-end, stage times, KV bytes and
compression ratio, failovers, retries, failures by code, tokens), `set_services(ready)` from
/ready, `in_flight` / `buffered` gauges; `render() -> (bytes, content_type)` for GET /metrics;
each of `observers` is handed what observe_request and observe_stream are (the dashboard's window).
Names: `pdbus_*`, seconds and bytes in base units, counters end in `_total`.
Every label value is from a fixed set: a failure's code is `wire.code_label(code)` (a code
a node invents is `other`). What a node reported (the trace's timings, the decode FINAL's `stats`,
the KV transfer reports) is read defensively: a value of the wrong type or range is skipped and
counted in `pdbus_ignored_node_values_total`, never an exception.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from nodes.wire import code_label

# Fine around the usual SLO targets (TPOT 50-100 ms, TTFT 0.5-6 s): the planner reads the share of
# requests within its targets from these buckets (`nodes.planner.slo_signals`).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0,
                   5.0, 6.0, 8.0, 10.0, 15.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
STAGES = ("plan_s", "queue_s", "prefill_s", "kv_transfer_s", "kv_wait_s", "decode_queue_s", "decode_s")
MAX_VALUE = 2**63 - 1


# (label, capacity name) of a node's whole and of the part a cache gave: prefill nodes count prompt
# tokens and prefix-cache hits; decode nodes the prompt tokens whose KV arrived and those it held.
PREFILL_KINDS = (("prompt", "prompt_tokens"), ("cached", "prefix_cached_tokens"))
DECODE_KINDS = (("imported", "kv_imported_tokens"), ("held", "prefix_reused_tokens"))

class GatewayMetrics:
    def __init__(self) -> None:
        disable_created_metrics()   # process-wide: the `_created` series only double the output
        self.registry = r = CollectorRegistry()
        self.observers: list[Any] = []   # the same values, unbucketed (nodes/gateway/dashboard.py)
        self.requests = Counter("pdbus_requests_total", "Requests by endpoint and outcome", ["endpoint", "outcome"],
                                registry=r)
        self.ttft = Histogram("pdbus_time_to_first_token_seconds", "Time to first token", buckets=LATENCY_BUCKETS,
                              registry=r)
        self.tpot = Histogram("pdbus_time_per_output_token_seconds", "Mean time per output token after the first",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.itl = Histogram("pdbus_inter_token_latency_seconds", "Time between consecutive tokens",
                             buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("pdbus_e2e_request_latency_seconds", "Request latency, received to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.stage = Histogram("pdbus_stage_seconds", "Per-stage time (plan, queue, prefill, kv_transfer, kv_wait, "
                               "decode_queue, decode)", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.kv_bytes = Counter("pdbus_kv_bytes_total", "KV cache bytes moved, raw (before quantization) and on "
                                "the wire; held: raw bytes not moved, the decode node kept them", ["kind"], registry=r)
        self.kv_ratio = Histogram("pdbus_kv_compression_ratio", "KV raw bytes / wire bytes per transfer",
                                  buckets=(1, 1.5, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.kv_transfer = Histogram("pdbus_kv_transfer_seconds", "Time of each verified KV transfer, "
                                     "encode to the receiver's last ACK", buckets=LATENCY_BUCKETS, registry=r)
        self.kv_checksum_failures = Counter("pdbus_kv_checksum_failures_total", "KV chunks that failed their "
                                            "checksum and were resent (in transfers that then verified)", registry=r)
        self.kv_resends = Counter("pdbus_kv_resends_total", "KV chunks sent again (NACKed or timed out)",
                                  registry=r)
        self.failovers = Counter("pdbus_failovers_total", "Decode resumes after a lost or stalled node", registry=r)
        self.prefill_retries = Counter("pdbus_prefill_retries_total", "Prefills re-sent (node lost, kv_failed "
                                       "after checksum retries, timeout)", registry=r)
        self.fallbacks = Counter("pdbus_prefill_fallback_local_total", "Requests prefilled on their decode node "
                                 "(no prefill node)", registry=r)
        self.failures = Counter("pdbus_cluster_failures_total", "Failed attempts inside requests, by code",
                                ["code"], registry=r)
        self.bad_replies = Counter("pdbus_bad_replies_total", "Node replies the cluster client refused as "
                                   "malformed (each failed over like a lost node)", registry=r)
        self.ignored = Counter("pdbus_ignored_node_values_total", "Values in nodes' reports (timings, stats, "
                               "KV transfer reports) of the wrong type or range, left out of the metrics", registry=r)
        self.prefix_tokens = Gauge("pdbus_prefill_prompt_tokens", "Each prefill node's prompt tokens since it "
                                   "started (kind=prompt) and those its prefix cache gave (kind=cached), as "
                                   "last reported", ["node", "kind"], registry=r)
        self.prefix_hit_ratio = Gauge("pdbus_prefix_cache_hit_ratio", "Cluster-wide prompt tokens served from "
                                      "prefill prefix caches over all prompt tokens prefilled", registry=r)
        self.decode_kv_tokens = Gauge("pdbus_decode_kv_tokens", "Each decode node's prompt tokens whose KV "
                                      "arrived from a prefill node (kind=imported) and those whose KV it held "
                                      "from a kept prefix (kind=held), as last reported", ["node", "kind"], registry=r)
        self.decode_hit_ratio = Gauge("pdbus_decode_prefix_hit_ratio", "Cluster-wide prompt tokens whose KV "
                                      "decode nodes held over those held or imported", registry=r)
        self._node_series: dict[str, set[str]] = {"prefill": set(), "decode": set()}   # the nodes with series now
        self.tokens = Counter("pdbus_tokens_total", "Tokens by kind (prompt, completion; prompt_cached: prompt "
                              "tokens whose KV was not computed, a cache gave it; prompt_kv_held: prompt tokens "
                              "whose KV the decode node kept, so it did not cross the wire)", ["kind"], registry=r)
        self.in_flight = Gauge("pdbus_requests_in_flight", "Requests being served now", registry=r)
        self.buffered = Gauge("pdbus_stream_buffered_tokens", "Tokens waiting in per-stream buffers (the "
                              "gateway's queue depth)", registry=r)
        self.nodes_live = Gauge("pdbus_nodes_live", "Nodes registered on the broker, by role", ["role"],
                                registry=r)
        self.broker_queued = Gauge("pdbus_broker_queued_requests", "Requests waiting in the broker's queue "
                                   "for a node with room, by service", ["service"], registry=r)
        self.services = Gauge("pdbus_service_available", "1 when at least one live node serves the service "
                              "(from the /ready probe)", ["service"], registry=r)

    def observe_request(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(endpoint, outcome).inc()
        for observer in self.observers:
            observer.observe_request(endpoint, outcome)

    def observe_stream(self, trace: Any, usage: dict[str, int], token_times: list[float], started: float,
                       ended: float) -> None:
        if token_times:
            self.ttft.observe(token_times[0] - started)
            gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
            for gap in gaps:
                self.itl.observe(gap)
            if gaps:
                self.tpot.observe(sum(gaps) / len(gaps))
        self.e2e.observe(ended - started)
        self._observe_trace(trace)
        self.tokens.labels("prompt").inc(usage.get("prompt_tokens", 0))
        self.tokens.labels("completion").inc(usage.get("completion_tokens", 0))
        self.tokens.labels("prompt_cached").inc(usage.get("cached_tokens", 0))
        self.tokens.labels("prompt_kv_held").inc(getattr(trace, "num_kv_held_tokens", 0))
        for observer in self.observers:
            observer.observe_stream(trace, usage, token_times, started, ended)

    def _observe_trace(self, trace: Any) -> None:
        for name in STAGES:
            if (value := self._number(trace.timings.get(name))) is not None:
                self.stage.labels(name[:-2]).observe(value)
        self._observe_kv(trace.decode_final, getattr(trace, "num_kv_held_tokens", 0))
        for transfer in getattr(trace, "kv_transfers", ()):
            self._observe_transfer(transfer)
        self.failovers.inc(trace.num_failovers)
        self.prefill_retries.inc(trace.num_prefill_retries)
        self.fallbacks.inc(1 if trace.fallback_local else 0)
        self.bad_replies.inc(getattr(trace, "num_bad_replies", 0))
        for failure in trace.failures:
            self.failures.labels(code_label(failure.split("@", 1)[0])).inc()

    def _observe_kv(self, decode_final: Any, num_held: int) -> None:
        stats = self._map(decode_final, "stats") if decode_final is not None else {}
        raw, wire = self._number(stats.get("kv_raw_bytes"), True), self._number(stats.get("kv_wire_bytes"), True)
        if raw and wire:
            self.kv_bytes.labels("raw").inc(raw)
            self.kv_bytes.labels("wire").inc(wire)
            self.kv_ratio.observe(raw / wire)
        prompt = self._number(self._map(decode_final, "usage").get("prompt_tokens"), True) if decode_final else None
        if raw and num_held and prompt and prompt > num_held:   # the transfer's bytes per token, times those held
            self.kv_bytes.labels("held").inc(raw * num_held / (prompt - num_held))

    def _observe_transfer(self, transfer: Any) -> None:
        if not isinstance(transfer, dict):
            self.ignored.inc()
            return
        if (seconds := self._number(transfer.get("seconds"))) is not None:
            self.kv_transfer.observe(seconds)
        self.kv_checksum_failures.inc(self._number(transfer.get("checksum_failures"), True) or 0)
        self.kv_resends.inc(self._number(transfer.get("resends"), True) or 0)

    def _map(self, value: Any, key: str) -> dict:
        """`value[key]` when both are maps, else {} (counted as ignored unless absent)."""
        found = value.get(key) if isinstance(value, dict) else value
        if isinstance(found, dict):
            return found
        if found is not None:
            self.ignored.inc()
        return {}

    def _number(self, value: Any, integer: bool = False) -> float | None:
        """A finite number in [0, 2**63) (an int when `integer`); None, counted as ignored, for anything else."""
        if value is None:
            return None
        kinds = int if integer else int | float
        if type(value) is bool or not isinstance(value, kinds) or not 0 <= value <= MAX_VALUE:   # NaN fails too
            self.ignored.inc()
            return None
        return value

    def set_broker_stats(self, stats: dict[str, Any] | None) -> None:
        """Mirror the broker's answer at scrape time; roles it no longer reports drop to 0."""
        if not stats:
            return
        roles = self._counts(stats.get("nodes_by_role"))
        for role in ("prefill", "decode", "both", "gateway", *roles):
            self.nodes_live.labels(role).set(roles.get(role, 0))
        for service, num_queued in self._counts(stats.get("queued_by_service")).items():
            self.broker_queued.labels(service).set(num_queued)
        capacities = stats.get("capacity_by_node", {})
        self._set_node_tokens(capacities, "prefill", self.prefix_tokens, self.prefix_hit_ratio, PREFILL_KINDS)
        self._set_node_tokens(capacities, "decode", self.decode_kv_tokens, self.decode_hit_ratio, DECODE_KINDS)

    def _counts(self, value: Any) -> dict[str, float]:
        """A {name: count} map of the broker's answer; what is not one is ignored (and counted), so a
        malformed answer never fails a scrape. Names are cut to 64 characters (label values)."""
        if not isinstance(value, dict):
            if value is not None:
                self.ignored.inc()
            return {}
        counts = {str(name)[:64]: self._number(count) for name, count in value.items()}
        return {name: count for name, count in counts.items() if count is not None}

    def _set_node_tokens(self, capacities: Any, side: str, gauge: Gauge, ratio: Gauge,
                         kinds: tuple[tuple[str, str], tuple[str, str]]) -> None:
        """Each node's pair of token counters (`kinds`: (label, capacity name) for the whole and for
        the part a cache gave), as last reported, and the cluster's ratio of the two; nodes no longer
        reported are dropped, so ids that come and go do not pile up."""
        if not isinstance(capacities, dict):
            return
        (whole_kind, whole_name), (part_kind, part_name) = kinds
        totals = [0.0, 0.0]
        seen: set[str] = set()
        for node_id, capacity in capacities.items():
            if not isinstance(capacity, dict) or part_name not in capacity:
                continue
            whole, part = self._number(capacity.get(whole_name)), self._number(capacity[part_name])
            if whole is None or part is None:
                continue
            node = str(node_id)[:128]
            seen.add(node)
            gauge.labels(node, whole_kind).set(whole)
            gauge.labels(node, part_kind).set(part)
            totals[0] += whole
            totals[1] += part
        for node in self._node_series[side] - seen:
            for kind in (whole_kind, part_kind):
                gauge.remove(node, kind)
        self._node_series[side] = seen
        denominator = totals[0] if side == "prefill" else totals[0] + totals[1]
        ratio.set(totals[1] / denominator if denominator else 0.0)

    def set_services(self, services: dict[str, bool]) -> None:
        for service, alive in services.items():
            self.services.labels(service).set(1 if alive else 0)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
