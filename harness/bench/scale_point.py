"""One measured point of `make bench-scale`: a fresh broker, load generators and load clients (and
the gateway for an HTTP point), a window of steady streaming, then the figures.

Contract: `run_point(Point, settle_s) -> dict` (one row: the point's settings, tokens/s relayed
and offered, latency p50/p99/p99.9 in ms, CPU per token and CPU fraction per role from /proc,
the broker's ceiling, tokens per bus message, and the counters that say what went wrong: client
errors, tokens out of order, late steps, dropped sends, `tail` (when the tokens slower than 5 ms
came), `broker_stop_timeouts` (a broker that ignored SIGTERM), `other_cpu_frac` (the CPU the rest
of the machine used in the window: other people's work on a shared machine)). Before any stream opens, the
broker's CPU with every node registered is measured for a second (`broker_idle_cpu_frac`:
heartbeats and timers); `broker_net_us_per_token` is its CPU per token above that. Every
process is new per point, so no point inherits another's queues; all are stopped before it returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from harness.bench.scale_procs import Fleet
from harness.bench.scale_stats import Histogram, derive, sent_between

BUS_CLIENT = "harness.bench.scale_client"
HTTP_CLIENT = "harness.bench.scale_http"
IDLE_S = 1.0
SATURATED = 0.9   # relayed below this share of the nominal offered rate: the point is past saturation


@dataclass(frozen=True)
class Point:
    path: str                 # "batched" (reply_batch) | "per-token" (one reply per token)
    nodes: int
    streams_per_node: int
    step_s: float
    transport: str = "bus"    # "bus" (BusClient) | "http" (through `pdbus gateway`)
    max_tokens: int = 256
    seconds: float = 5.0
    nodes_per_process: int = 32
    client_processes: int = 1

    @property
    def num_streams(self) -> int:
        return self.nodes * self.streams_per_node

    @property
    def nominal_per_s(self) -> float:
        return self.num_streams / self.step_s

    @property
    def max_batch(self) -> int:
        # Some room above the target: the broker balances by outstanding requests, and a FINAL
        # and its stream's replacement cross on the wire.
        return self.streams_per_node + max(1, self.streams_per_node // 4)


def run_point(point: Point, settle_s: float = 1.0, brokers: int = 1, gateways: int = 1) -> dict:
    with Fleet() as fleet:
        fleet.broker(brokers)
        http = point.transport == "http"
        loadgens = fleet.loadgens(point.nodes, point.nodes_per_process, point.step_s, point.max_batch,
                                  per_token=point.path == "per-token", stamp="text" if http else "field")
        target = fleet.gateway(workers=gateways) if http else fleet.endpoint
        idle = _broker_idle(fleet, IDLE_S)
        clients = fleet.clients(HTTP_CLIENT if http else BUS_CLIENT, target, point.num_streams,
                                point.client_processes, point.max_tokens)
        start = time.monotonic() + settle_s
        end = start + point.seconds
        for client in clients:
            client.send(f"{start} {end}")
        time.sleep(max(0.0, start - time.monotonic()))
        cpu_before = fleet.cpu_by_role()
        time.sleep(max(0.0, end - time.monotonic()))
        cpu_used = {role: used - cpu_before.get(role, 0.0) for role, used in fleet.cpu_by_role().items()}
        machine_busy = cpu_used.pop("machine")
        results = [client.expect("result", 60) for client in clients]
        for loadgen in loadgens:
            loadgen.terminate()
        stats = [loadgen.expect("stats", 60) for loadgen in loadgens]
    row = _row(point, start, end, cpu_used, results, stats)
    row["broker_idle_cpu_frac"] = idle
    # Everything else the machine ran meanwhile (this bench's own driver included): on a shared
    # 2-core machine, the reason one run's figures differ from another's.
    row["other_cpu_frac"] = max(0.0, machine_busy - sum(cpu_used.values())) / point.seconds
    row["broker_stop_timeouts"] = fleet.broker_stop_timeouts   # killed after SIGTERM + 5 s
    net = max(0.0, row["broker_cpu_frac"] - idle)
    row["broker_net_us_per_token"] = net / row["tokens_per_s"] * 1e6 if row["tokens_per_s"] else None
    return row


def _broker_idle(fleet: Fleet, seconds: float) -> float:
    """The broker's CPU fraction with every node registered and no stream yet: heartbeats and
    timers, the part of its CPU that no token causes."""
    before = fleet.cpu_by_role()["broker"]
    time.sleep(seconds)
    return (fleet.cpu_by_role()["broker"] - before) / seconds


def _row(point: Point, start: float, end: float, cpu_used: dict[str, float], results: list[dict],
         stats: list[dict]) -> dict:
    latency = Histogram()
    for result in results:
        latency.merge(Histogram.from_json(result["latency"]))
    num_tokens = sum(result["tokens"] for result in results)
    offered = sum(sent_between(s["timeline"], start, end) for s in stats)
    row: dict = asdict(point) | {"streams": point.num_streams, "nominal_per_s": point.nominal_per_s}
    row |= derive(num_tokens, offered, end - start, cpu_used)
    row |= {"p50_ms": latency.percentile(50), "p99_ms": latency.percentile(99),
            "p999_ms": latency.percentile(99.9), "num_latency_samples": latency.count}
    row["saturated"] = row["tokens_per_s"] < SATURATED * point.nominal_per_s
    row["client_counters"] = _summed(r["counters"] for r in results)
    row["tail"] = sorted(sample for r in results for sample in r["tail"])
    row["loadgen_counters"] = _summed(s["counters"] for s in stats)
    endpoint = _summed(s["endpoint"] for s in stats)
    row["loadgen_endpoint"] = {k: v for k, v in endpoint.items() if k.startswith(("sent.", "dropped.", "failed."))}
    counters = row["loadgen_counters"]
    num_messages = endpoint.get("sent.streams", 0) + endpoint.get("sent.partial", 0)
    # Tokens per bus message on the batched path (the old path: 1); over the whole run.
    row["tokens_per_message"] = counters.get("tokens", 0) / num_messages if num_messages else 1.0
    return row


def _summed(maps: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for values in maps:
        for key, value in values.items():
            total[key] = max(total.get(key, 0), value) if key == "max_batch_seen" else total.get(key, 0) + value
    return total
