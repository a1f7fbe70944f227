"""Per-phase results: attainment over the requests sent in a phase, goodput per second of it,
TTFT/TPOT percentiles; the elasticity goal checked on rows; the phase table and plot."""

from __future__ import annotations

import pytest

from harness.bench.serve.load_generator import RequestResult
from harness.bench.serve.phase_metrics import elastic_targets, phase_summaries, phase_table
from harness.bench.serve.phase_plots import plot_phases
from harness.bench.serve.phased_workload import phase_plan
from harness.bench.serve.serve_metrics import MIXED_SLO

PLAN = phase_plan(1.0, 10.0, same_rate=True)


def result(phase: str, kind: str = "chat", ttft: float = 0.1, tpot: float = 0.02, ok: bool = True) -> RequestResult:
    """A request of 11 tokens: TTFT `ttft`, then 10 gaps of `tpot`."""
    return RequestResult(kind, 100, 11, success=ok, output_tokens=11 if ok else 0, ttft=ttft,
                         latency=ttft + 10 * tpot, itl=[tpot] * 10, phase=phase)


def test_each_phase_counts_the_requests_sent_in_it():
    results = [result("chat-1"), result("chat-1", ttft=2.5),                       # chat TTFT bound 2 s: 1 of 2
               result("document", "document", ttft=5.0), result("document", "document", tpot=0.2),
               result("document", ok=False), result("document", "document", ttft=1.0),
               result("chat-2", ttft=0.2), result("chat-2", ttft=0.4)]
    chat1, document, chat2 = phase_summaries(results, PLAN, MIXED_SLO)
    assert (chat1["phase"], chat1["sent"], chat1["num_slo_met"]) == ("chat-1", 2, 1)
    assert chat1["slo_attainment"] == 0.5 and chat1["slo_goodput"] == pytest.approx(0.1)   # 1 met / 10 s
    assert (document["sent"], document["completed"], document["failed"]) == (4, 3, 1)
    assert document["slo_attainment"] == 0.5                              # TPOT 200 ms and the failure miss
    assert document["slo_attainment_by_kind"] == {"chat": 0.0, "document": pytest.approx(2 / 3)}
    assert document["request_throughput"] == pytest.approx(0.3)
    assert (chat2["slo_attainment"], chat2["slo_goodput"]) == (1.0, pytest.approx(0.2))
    assert chat2["median_ttft_ms"] == pytest.approx(300) and chat2["p99_ttft_ms"] == pytest.approx(398)
    assert chat2["median_tpot_ms"] == pytest.approx(20) and "p90_tpot_ms" in chat2
    assert (chat2["start_s"], chat2["end_s"], chat2["rate"]) == (20.0, 30.0, 1.0)


def test_a_phase_without_requests_is_zero_not_an_error():
    empty = phase_summaries([], PLAN, MIXED_SLO)
    assert [p["sent"] for p in empty] == [0, 0, 0] and empty[0]["slo_attainment"] == 0.0
    assert empty[0]["slo_goodput"] == 0.0


def row(system: str, goodputs: list[float], rate: str = "2") -> dict:
    phases = [{"phase": p.name, "rate": p.rate, "start_s": p.start_s, "end_s": p.end_s, "sent": 10, "failed": 0,
               "slo_attainment": g / 2, "slo_goodput": g, "median_ttft_ms": 100.0, "p99_ttft_ms": 900.0,
               "median_tpot_ms": 20.0, "p99_tpot_ms": 50.0} for p, g in zip(PLAN, goodputs, strict=True)]
    return {"system": system, "status": "ok", "request_rate": rate, "phases": phases}


def test_the_elastic_system_meets_both_goals():
    rows = [row("pdbus-disagg", [1.0, 0.5, 1.0]), row("pdbus-coloc", [1.5, 0.4, 1.5]),
            row("pdbus-elastic", [1.5, 0.6, 1.6])]
    best, worst = elastic_targets(rows)
    assert best["met"] and best["value"] == pytest.approx(1.0) and "document 1.20x" in best["note"]
    assert worst["met"] and worst["value"] == pytest.approx(3.7 / 2.5)
    sent_per_s = sum(10 / (p.end_s - p.start_s) for p in PLAN)          # 10 sent a phase
    assert worst["note"] == f"worst: pdbus-disagg; ceiling {sent_per_s / 2.5:.2f}x (every request sent within its SLO)"


def test_a_phase_below_the_best_static_misses():
    rows = [row("pdbus-disagg", [1.0, 0.5, 1.0]), row("pdbus-coloc", [1.5, 0.4, 1.5]),
            row("pdbus-elastic", [1.2, 0.5, 1.5])]
    best, worst = elastic_targets(rows)
    assert not best["met"] and best["value"] == pytest.approx(0.8)
    assert not worst["met"] and worst["value"] == pytest.approx(1.28)


def test_zero_goodput_everywhere_is_not_a_division_by_zero():
    rows = [row(s, [0.0, 0.0, 0.0]) for s in ("pdbus-disagg", "pdbus-coloc", "pdbus-elastic")]
    best, worst = elastic_targets(rows)
    assert best["value"] == 1.0 and worst["value"] == 1.0 and not worst["met"]


def test_a_missing_static_system_is_not_measurable():
    rows = [row("pdbus-disagg", [1, 1, 1]), row("pdbus-elastic", [1, 1, 1]),
            {"system": "pdbus-coloc", "status": "failed: boom"}]
    target, = elastic_targets(rows)
    assert target["met"] is None
    assert elastic_targets([row("pdbus-disagg", [1, 1, 1])]) == []


def test_the_phase_table_and_plot(tmp_path):
    rows = [row("pdbus-disagg", [1.0, 0.5, 1.0]), row("pdbus-elastic", [1.5, 0.6, 1.6]),
            {"system": "pdbus-coloc", "status": "failed: boom"}]
    rows[1]["role_timeline"] = [{"t_s": 0.0, "prefill": 1, "decode": 1, "both": 0, "switching": 0, "draining": 0},
                                {"t_s": 6.0, "prefill": 0, "decode": 2, "both": 0, "switching": 0, "draining": 0}]
    rows[1]["planner_decisions"] = [{"t_s": 5.0, "kind": "switch_role", "role": "decode", "node_id": "prefill-0",
                                     "reason": "decode hot"}]
    text = phase_table(rows)
    assert len(text.splitlines()) == 2 + 6 and "| pdbus-elastic | 2 | document (1.00/s) | 10 | 30% | 0.60 |" in text
    png = plot_phases(rows, tmp_path / "p.png", "title", 100.0)
    assert png.stat().st_size > 10_000
