"""The planner's Prometheus text: decisions by kind and pool, held reasons, the shell's counts and
the pools' gauges, read at scrape time; served on /metrics."""

from __future__ import annotations

from collections import Counter

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from nodes.planner.planner_metrics import PlannerMetrics, serve_metrics
from scheduler.planner import Planner
from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import parse_snapshot
from tests.scheduler.planner_helpers import decode_cap, pools, prefill_cap


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def planner_after_a_switch() -> Planner:
    planner = Planner(PlannerConfig(sustain_s=0, cooldown_s=0, max_nodes=3))
    body = pools([prefill_cap(5 * 2048)], [decode_cap(0, switchable=1), decode_cap(1, switchable=1)])
    planner.decide(parse_snapshot(body), 1.0)
    planner.decide(parse_snapshot(body), 2.0)
    return planner


def test_the_text_has_decisions_held_reasons_counts_and_gauges():
    shell_counts = Counter({"wanted.decode": 2, "failed_actions.scale_down": 1, "no_stats": 4})
    planner = planner_after_a_switch()
    planner.metrics["regrets.decode"] += 3
    body, content_type = PlannerMetrics(planner, shell_counts).render()
    assert content_type.startswith("text/plain")
    got = samples(body.decode())
    assert got[("pdbus_planner_decisions_total", (("kind", "switch_role"), ("role", "prefill")))] == 1
    assert got[("pdbus_planner_held_total", (("reason", "waiting"),))] == 1
    assert got[("pdbus_planner_wanted_total", (("role", "decode"),))] == 2
    assert got[("pdbus_planner_regrets_total", (("role", "decode"),))] == 3
    assert got[("pdbus_planner_failed_actions_total", (("kind", "scale_down"),))] == 1
    assert got[("pdbus_planner_no_stats_total", ())] == 4
    assert got[("pdbus_planner_snapshots_total", ())] == 2
    assert got[("pdbus_planner_pressure", (("pool", "prefill"),))] == 5.0
    assert got[("pdbus_planner_nodes", (("pool", "decode"),))] == 2
    assert got[("pdbus_planner_state", (("pool", "prefill"), ("state", "hot")))] == 1
    assert got[("pdbus_planner_serving_nodes", ())] == 3


def test_before_any_snapshot_the_text_has_no_pool_gauges():
    got = samples(PlannerMetrics(Planner(), Counter()).render()[0].decode())
    assert got[("pdbus_planner_snapshots_total", ())] == 0
    assert not any(name == "pdbus_planner_pressure" for name, _ in got)


async def test_metrics_are_served_on_their_port():
    metrics = PlannerMetrics(planner_after_a_switch(), Counter())
    runner, port = await serve_metrics(metrics, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            assert 'pdbus_planner_decisions_total{kind="switch_role",role="prefill"} 1.0' in await response.text()
    finally:
        await runner.cleanup()
