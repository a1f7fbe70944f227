"""`make bench-scale`'s arithmetic and report, sans I/O: histograms merged across processes,
offered rates read off a timeline, the derived figures, and the summary's targets."""

from __future__ import annotations

import json

import pytest

from harness.bench.scale_report import print_table, summarize, write_results
from harness.bench.scale_stats import Histogram, Window, derive, sent_between


def test_percentiles_are_within_two_percent_and_merge_exactly():
    one, two = Histogram(), Histogram()
    for i in range(1, 1001):
        (one if i % 2 else two).add(i / 1000 * 0.01)   # 10 us .. 10 ms
    one.merge(Histogram.from_json(json.loads(json.dumps(two.to_json()))))
    assert one.count == 1000
    assert one.percentile(50) == pytest.approx(5.0, rel=0.02)
    assert one.percentile(99) == pytest.approx(9.9, rel=0.02)
    assert Histogram().percentile(99) is None


def test_a_window_holds_its_start_not_its_end():
    window = Window(10.0, 12.0)
    assert window.holds(10.0) and window.holds(11.99) and not window.holds(12.0) and window.seconds == 2.0


def test_sent_between_interpolates_the_timeline():
    timeline = [[0.0, 0], [1.0, 100], [2.0, 300]]
    assert sent_between(timeline, 0.5, 1.5) == pytest.approx(150)
    assert sent_between(timeline, -1.0, 5.0) == 300
    assert sent_between([], 0.0, 1.0) == 0


def test_derive_states_cpu_per_token_and_the_broker_ceiling():
    assert derive(0, 0, 1.0, {"broker": 0.0})["broker_us_per_token"] is None
    out = derive(100_000, 110_000, 2.0, {"broker": 0.5, "client": 1.0})
    assert out["tokens_per_s"] == 50_000 and out["offered_per_s"] == 55_000
    assert out["broker_cpu_frac"] == 0.25 and out["broker_us_per_token"] == pytest.approx(5.0)
    assert out["broker_ceiling_tokens_per_s"] == pytest.approx(200_000)


def row(section, path, tokens_per_s, broker_us, p99=1.0, nodes=16, transport="bus", **extra):
    return {"section": section, "path": path, "transport": transport, "nodes": nodes, "streams": nodes * 64,
            "tokens_per_s": tokens_per_s, "broker_us_per_token": broker_us, "p50_ms": p99 / 2, "p99_ms": p99,
            "broker_ceiling_tokens_per_s": tokens_per_s * 4, "saturated": False, **extra}


def test_the_summary_judges_each_target(tmp_path, capsys):
    rows = [row("ceiling", "batched", 1_500_000, 0.7, transport="raw", churn_tokens=256),
            row("ceiling", "per-token", 40_000, 25.0, transport="raw", churn_tokens=256),
            row("ceiling", "batched", 3_000_000, 0.3, transport="raw", churn_tokens=0),
            row("rate", "batched", 50_000, 3.0), row("rate", "batched", 60_000, 3.5, saturated=True),
            row("rate", "per-token", 14_000, 30.0),
            row("half", "batched", 30_000, 3.0, p99=4.0), row("half", "per-token", 7_000, 30.0, p99=7.0),
            row("nodes", "batched", 3_200, 9.0, nodes=1), row("nodes", "per-token", 3_200, 40.0, nodes=1),
            row("nodes", "batched", 50_000, 3.0), row("nodes", "per-token", 15_000, 42.0),
            {"section": "nodes", "path": "batched", "transport": "bus", "nodes": 64, "failed": "no ready"},
            row("nodes", "batched", 1_900, 110.0, nodes=256), row("nodes", "per-token", 0, None, nodes=256)]
    summary = summarize(rows)
    assert summary["saturation_tokens_per_s"] == {"batched": 60_000, "per-token": 14_000}
    targets = summary["targets"]
    assert targets["half_saturation_p99_le_5ms"] == {"batched": True, "per-token": False}
    assert targets["batched_broker_cpu_le_tenth_of_per_token"] == {
        "1 nodes": False, "16 nodes": True, "saturation": False, "broker alone": True}
    assert summary["broker_ceiling_tokens_per_s_batched"]["measured_alone"] == 1_500_000   # with churn
    assert targets["one_broker_ge_1M_tokens_per_s_at_64_streams_per_node"] == {
        "derived_at_saturation": False, "measured_alone": True}
    print_table(rows, summary)
    assert "FAILED" in capsys.readouterr().out
    full, brief = write_results(tmp_path, "scale-test", rows, summary, {"skip": {"http"}})
    assert json.loads(brief.read_text())["args"]["skip"] == ["http"] and len(json.loads(full.read_text())["rows"]) == 15
