"""The planner's Prometheus metrics, read from the core and the shell at each scrape.

Contract: `PlannerMetrics(planner, shell_counts)`: a registry of its own whose collector reads
`planner.metrics`, `planner.gauges()` and the shell's Counter when scraped (so nothing is copied
on the planner's path); `render() -> (bytes, content_type)`; `await serve_metrics(metrics, host,
port) -> (runner, port)` serves GET /metrics (aiohttp; port 0: any free port).
Series: `pdbus_planner_decisions_total{kind,role}`, `pdbus_planner_held_total{reason}`
(snapshots that ended without an action, by reason), `pdbus_planner_wanted_total{role}`
(scale-ups the actuator could not do), `pdbus_planner_regrets_total{role}` (role switches held
back by the layout memory, the role they would have made), `pdbus_planner_failed_actions_total{kind}`,
`pdbus_planner_snapshots_total`, `pdbus_planner_malformed_nodes_total` (node reports skipped),
`pdbus_planner_no_stats_total` (the broker did not answer), and gauges
`pdbus_planner_pressure{pool}`, `pdbus_planner_nodes{pool}` (active), `pdbus_planner_queued{pool}`
(requests waiting at the broker), `pdbus_planner_state{pool,state}` (1 while hot / cold is
sustained), `pdbus_planner_serving_nodes`, `pdbus_planner_draining_nodes`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.planner import Planner
from scheduler.planner_signals import POOL_ROLES

PREFIX = "pdbus_planner"


class _PlannerCollector(Collector):
    def __init__(self, planner: Planner, shell_counts: Counter[str]) -> None:
        self.planner, self.shell_counts = planner, shell_counts

    def collect(self) -> Iterator[Metric]:
        counts = Counter(self.planner.metrics) + Counter(self.shell_counts)
        yield _labelled(counts, "decisions", "Decisions taken, by kind and pool", ["kind", "role"])
        yield _labelled(counts, "held", "Snapshots that ended without an action, by reason", ["reason"])
        yield _labelled(counts, "wanted", "Scale-ups the actuator could not carry out", ["role"])
        yield _labelled(counts, "regrets", "Role switches held back by the layout memory, by the role "
                        "they would have made", ["role"])
        yield _labelled(counts, "failed_actions", "Actions that failed when carried out", ["kind"])
        for name, what in (("snapshots", "Broker snapshots read"), ("malformed_nodes", "Node reports skipped as "
                           "malformed"), ("no_stats", "Ticks without an answer from the broker")):
            yield CounterMetricFamily(f"{PREFIX}_{name}", what, value=counts[name])
        yield from _gauges(self.planner.gauges())


def _labelled(counts: Counter[str], prefix: str, what: str, labels: list[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{prefix}", what, labels=labels)
    for key, value in sorted(counts.items()):
        parts = key.split(".", len(labels))
        if parts[0] == prefix and len(parts) == len(labels) + 1:
            family.add_metric(parts[1:], value)
    return family


def _gauges(gauges: dict[str, float]) -> Iterator[Metric]:
    families = {name: GaugeMetricFamily(f"{PREFIX}_{name}", what, labels=["pool"])
                for name, what in (("pressure", "Pool pressure (prefill: batches queued per node; decode: "
                                    "KV or stream use)"), ("nodes", "Active (not draining) nodes"),
                                   ("queued", "Requests waiting at the broker"))}
    state = GaugeMetricFamily(f"{PREFIX}_state", "1 while the pool's hot or cold state is sustained",
                              labels=["pool", "state"])
    for pool in POOL_ROLES:
        if f"{pool}_pressure" not in gauges:
            continue
        for name, family in families.items():
            family.add_metric([pool], gauges[f"{pool}_{name}"])
        for name in ("hot", "cold"):
            state.add_metric([pool, name], gauges[f"{pool}_{name}"])
    yield from (*families.values(), state)
    for name in ("serving_nodes", "draining_nodes"):
        yield GaugeMetricFamily(f"{PREFIX}_{name}", name.replace("_", " "), value=gauges.get(name, 0.0))


class PlannerMetrics:
    def __init__(self, planner: Planner, shell_counts: Counter[str]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_PlannerCollector(planner, shell_counts))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


async def serve_metrics(metrics: PlannerMetrics, host: str, port: int) -> tuple[web.AppRunner, int]:
    """GET /metrics on host:port; the runner (cleanup() stops it) and the port it bound."""
    async def handle(_: web.Request) -> web.Response:
        body, content_type = metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server is not None else ()   # type: ignore[attr-defined]
    return runner, sockets[0].getsockname()[1] if sockets else port
