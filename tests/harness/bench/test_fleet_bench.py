"""The fleet bench (`make bench-scale`'s fleet half): a small real fleet registers and its heartbeat
cost is measured, the floor server serves the same swarm, the scheduler rows at small sizes, and the
report's verdict and files."""

from __future__ import annotations

import json
import math

import pytest

from harness.bench.fleet_bench import heartbeat_load, scheduler_rows
from harness.bench.fleet_floor import core_cost
from harness.bench.fleet_report import lost_nodes, print_tables, summary, write_results
from harness.bench.idle_endpoint import idle_endpoint_cost


@pytest.mark.integration
@pytest.mark.slow   # asserts no link was lost: a CPU-starved 2-core machine (a suite beside a bench) can lose one
def test_a_small_fleet_registers_with_the_real_broker_and_its_cost_is_measured():
    row = heartbeat_load(50, seconds=3.0, settle_s=1.2)
    assert row["registered"] == 50 and row["nodes_by_role"].get("decode") == 50
    assert row["nodes_left"] == 0 and row["links_lost"] == 0 and row["reconnects"] == 0 and lost_nodes(row) == 0
    assert row["registered_at_end"] == 50 and not row["broker_stalled"]
    assert math.isfinite(row["broker_cpu_pct"]) and 0 <= row["broker_cpu_pct"] < 100
    assert row["broker_main_pct"] + row["broker_zmq_pct"] <= row["broker_cpu_pct"] + 1
    # 50 idle nodes, one heartbeat each every idle interval (1-1.05 s), both ways.
    assert 35 < row["to_broker_per_s"] < 70 and 35 < row["from_broker_per_s"] < 70


@pytest.mark.integration
def test_the_floor_server_keeps_the_same_swarm_alive():
    row = heartbeat_load(20, seconds=2.0, server_kind="floor", settle_s=1.2)
    assert row["registered"] == 20 and lost_nodes(row) == 0 and row["from_broker_per_s"] > 10


@pytest.mark.integration
def test_idle_endpoints_cost_is_measured_with_real_endpoints_and_broker():
    # CPU time comes in 10 ms clock ticks: a few idle endpoints for a second may read 0.
    row = idle_endpoint_cost(4, seconds=2.0, idle_ms=250, settle_s=0.3)
    assert row["endpoints"] == 4 and row["window_s"] >= 1.9
    assert 0 <= row["endpoint_ms_per_s"] < 100 and row["broker_cpu_pct"] >= 0


def test_broker_core_alone_is_fed_a_steady_state_without_expiring_anyone():
    cost = core_cost(200, seconds=0.5)   # asserts inside that every node is still registered
    assert cost["on_frames_pct"] > 0 and cost["tick_pct"] > 0


def test_scheduler_rows_at_small_sizes_are_near_the_ideal():
    for row in scheduler_rows([20, 50]):
        assert row["ring_min_mean"] < 1 < row["ring_max_mean"] < 2.5
        assert 0.3 < row["join_moved"] / row["join_ideal"] < 3 and 0.3 < row["leave_moved"] / row["leave_ideal"] < 3
        assert row["bounded_max_mean"] <= 1.25 + 1 / 8   # ceil((1+eps) x mean), mean 8 streams a node
        assert row["decode_decision_ms"] > 0 and row["join_ms"] > 0 and row["leave_ms"] > 0


def _row(nodes: int, cpu: float, **extra: object) -> dict:
    return {"server": "broker (cluster policy)", "nodes": nodes, "capacity_hz": 0.0, "registered": nodes,
            "register_s": 1.0, "register_server_cpu_s": 0.5, "broker_cpu_pct": cpu, "broker_main_pct": cpu / 2,
            "broker_zmq_pct": cpu / 2, "swarm_cpu_pct": 10.0, "to_broker_per_s": 3600.0, "from_broker_per_s": 3800.0,
            "broker_us_per_msg": 20.0, "nodes_by_role": {"decode": nodes}, "stats_error": None, "nodes_left": 0,
            "links_lost": 0, "reconnects": 0, "broker_stalled": False, **extra}


def _report(cpu_at_1000: float) -> dict:
    scheduler = [{"nodes": 1000, "ring_max_mean": 1.5, "ring_min_mean": 0.6, "bounded_max_mean": 1.2,
                  "join_moved": 0.001, "join_ideal": 1 / 1001, "leave_moved": 0.001, "leave_ideal": 0.001,
                  "decode_decision_ms": 0.4, "join_ms": 0.5, "leave_ms": 0.6}]
    return {"when": "2026-12-05T12:00:00+00:00", "machine": "test", "target_pct": 10.0,
            "heartbeat": [_row(1000, cpu_at_1000), _row(10_000, 90.0, nodes_left=7),
                          _row(1000, 7.0, server="floor (shell + liveness only)"),
                          # every link at 250 ms, side by side: never the verdict's row
                          _row(1000, 4 * cpu_at_1000, server="broker (cluster policy), idle = 250 ms (before)",
                               before=True)],
            "core": [{"nodes": 1000, "on_frames_pct": 0.3, "tick_pct": 0.4}], "scheduler": scheduler,
            "endpoint": [{"endpoints": 16, "idle_ms": 1000, "window_s": 10.0, "endpoint_ms_per_s": 1.5,
                          "broker_cpu_pct": 0.2}]}


@pytest.mark.parametrize(("cpu", "verdict"), [(8.0, "met"), (16.0, "MISSED")])
def test_the_verdict_reads_the_broker_row_at_1000_nodes(cpu, verdict, capsys):
    report = _report(cpu)
    print_tables(report)
    assert f"of one core: {verdict}" in capsys.readouterr().out
    assert summary(report)["target"]["met"] is (verdict == "met")
    assert [h["lost"] for h in summary(report)["heartbeat"]] == [0, 7, 0, 0]


def test_results_are_written_as_json_summary_and_png(tmp_path):
    paths = write_results(_report(8.0), tmp_path)
    full, brief, png = paths
    assert json.loads(full.read_text())["heartbeat"][0]["nodes"] == 1000
    assert json.loads(brief.read_text())["target"] == {"nodes": 1000, "max_broker_cpu_pct": 10.0,
                                                       "broker_cpu_pct": 8.0, "met": True}
    assert brief.name == "fleet-summary.json" and png.read_bytes()[:4] == b"\x89PNG"
