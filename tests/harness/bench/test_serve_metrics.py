"""Metric definitions on synthetic timelines: vLLM's TTFT/TPOT/ITL/E2EL, throughput, goodput and
key names; DistServe's SLO attainment (failures miss, per-kind TTFT bounds)."""

import pytest

from harness.bench.serve.load_generator import RequestResult
from harness.bench.serve.serve_metrics import (
    MIXED_SLO,
    Slo,
    highest_rate_meeting,
    parse_goodput,
    slo_attainment,
    summarize,
    tpot,
)

# The keys `vllm bench serve --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99` writes.
VLLM_KEYS = {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput",
             *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
               for s in ("mean", "median", "std", "p50", "p90", "p99"))}


def timeline(kind="chat", prompt_len=10, ttft=0.5, gaps=(0.05, 0.05, 0.05), success=True):
    """A request whose first token came at `ttft` and each next one `gaps` later."""
    return RequestResult(kind, prompt_len, len(gaps) + 1, success=success, output_tokens=len(gaps) + 1 if success else 0,
                         ttft=ttft, latency=ttft + sum(gaps), itl=list(gaps) if success else [])


def test_tpot_is_time_after_the_first_token_over_the_remaining_tokens():
    assert tpot(timeline(ttft=1.0, gaps=(0.1, 0.3))) == pytest.approx(0.2)
    assert tpot(timeline(gaps=())) == 0.0                # one token: no TPOT


def test_summary_has_vllms_key_names_and_definitions():
    results = [timeline(ttft=0.5, gaps=(0.1, 0.1, 0.1)), timeline(prompt_len=30, ttft=1.5, gaps=(0.2, 0.4)),
               timeline(success=False)]
    summary = summarize(results, duration_s=4.0, goodput={"ttft": 1000, "tpot": 200})
    assert set(summary) >= VLLM_KEYS
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["total_input_tokens"] == 40 and summary["total_output_tokens"] == 7
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(7 / 4)
    assert summary["total_token_throughput"] == pytest.approx(47 / 4)
    assert summary["mean_ttft_ms"] == pytest.approx(1000)
    assert summary["median_tpot_ms"] == pytest.approx(200)          # 100 and 300 ms
    assert summary["mean_itl_ms"] == pytest.approx(1000 * 0.9 / 5)   # every gap of every request
    assert summary["p99_e2el_ms"] == pytest.approx(2087.0)
    assert summary["request_goodput"] == pytest.approx(0.25)          # only the first meets both bounds


def test_percentile_keys_are_named_as_vllm_names_them():
    summary = summarize([timeline()], 1.0, percentiles=(99.9, 25))
    assert {"p99.9_ttft_ms", "p25_itl_ms"} <= set(summary)


def test_slo_attainment_counts_failures_as_misses_and_uses_each_kinds_ttft_bound():
    results = [timeline("chat", ttft=1.9), timeline("chat", ttft=2.1),
               timeline("document", ttft=5.0), timeline("document", ttft=1.0, gaps=(0.2, 0.2)),
               timeline("chat", success=False)]
    found = slo_attainment(results, MIXED_SLO)
    assert found["num_slo_met"] == 2 and found["slo_attainment"] == pytest.approx(0.4)
    assert found["slo_attainment_by_kind"] == {"chat": pytest.approx(1 / 3), "document": 0.5}
    assert Slo({"*": 3000}, 100).met(timeline("chat", ttft=2.1))


def test_highest_rate_meeting_the_attainment_target():
    assert highest_rate_meeting([(0.5, 1.0), (1.0, 0.92), (1.5, 0.6)]) == 1.0
    assert highest_rate_meeting([(0.5, 0.5)]) is None


def test_goodput_flags_are_parsed_or_refused_clearly():
    assert parse_goodput(["ttft:2000", "tpot:100"]) == {"ttft": 2000.0, "tpot": 100.0}
    for bad in (["latency:5"], ["ttft"], ["ttft:-1"]):
        with pytest.raises(ValueError, match="goodput"):
            parse_goodput(bad)
