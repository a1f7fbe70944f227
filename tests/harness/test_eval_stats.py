"""harness.eval.eval_stats: paired differences and their interval, exactness, the table; and the
runner's summary over fake runs (no lm-eval, no model)."""

from __future__ import annotations

import pytest

from harness.eval import eval_stats
from harness.eval.eval_stats import paired_difference


def _samples(scores: dict[int, float], metric: str = "acc", filter_name: str = "none", resps=None) -> list[dict]:
    return [{"doc_id": i, "filter": filter_name, metric: v, "resps": (resps or {}).get(i, [[str(v)]])}
            for i, v in scores.items()]


def test_identical_runs_differ_by_exactly_zero():
    a = {i: float(i % 2) for i in range(50)}
    diff = paired_difference(a, dict(a))
    assert (diff.mean, diff.low, diff.high, diff.num_items, diff.num_a_only, diff.num_b_only) == (0, 0, 0, 50, 0, 0)


def test_the_interval_holds_the_mean_and_counts_the_discordant_items():
    a = {i: 1.0 for i in range(100)}
    b = {i: (0.0 if i < 10 else 1.0) for i in range(100)} | {100: 1.0}   # item 100 is in b only: not paired
    diff = paired_difference(a, b)
    assert diff.mean == pytest.approx(-0.10)
    assert diff.low <= diff.mean <= diff.high < 0
    assert (diff.num_items, diff.num_b_only, diff.num_a_only) == (100, 0, 10)
    assert diff.low == pytest.approx(-0.16, abs=0.03)   # binomial: 0.1 +- 1.96 * 0.03


def test_the_interval_is_deterministic_for_a_seed_and_pairs_items():
    a = {i: float(i % 3 == 0) for i in range(60)}
    b = {i: float(i % 3 == 0 or i % 7 == 0) for i in range(60)}
    assert paired_difference(a, b, seed=3) == paired_difference(a, b, seed=3)
    # b gains on the same items: an unpaired bootstrap would straddle zero; the paired one cannot
    assert paired_difference(a, b).low > 0


def test_runs_with_no_common_item_are_refused():
    with pytest.raises(ValueError, match="no scored item"):
        paired_difference({1: 1.0}, {2: 1.0})


def test_item_scores_read_one_filter_of_one_metric():
    samples = _samples({0: 1.0, 1: 0.0}, "exact_match", "strict") + _samples({0: 0.0, 1: 1.0}, "exact_match", "flexible")
    assert eval_stats.item_scores(samples, "exact_match", "flexible") == {0: 0.0, 1: 1.0}
    assert eval_stats.item_scores(samples, "acc") == {}


def test_same_responses_compares_raw_responses_bit_for_bit():
    import numpy as np

    a = _samples({0: 1.0, 1: 1.0, 2: 0.0}, resps={0: [[(-1.5, True)]], 1: [[" Paris"]], 2: [[(-2.0, False)]]})
    b = _samples({0: 1.0, 1: 1.0, 3: 0.0}, resps={0: [((np.float64(-1.5), np.bool_(True)),)], 1: [[" Paris."]],
                                                 3: [[(-2.0, False)]]})
    assert eval_stats.same_responses(a, b) == (1, 2)   # doc 0 equal (lists vs tuples, numpy scalars), 1 not


def test_the_loglikelihood_gap_is_the_largest_over_items_and_choices():
    a = _samples({0: 1.0, 1: 0.0}, resps={0: [[(-1.0, True)], [(-2.0, False)]], 1: [[(-3.0, False)], [(-0.5, True)]]})
    b = _samples({0: 1.0, 1: 0.0}, resps={0: [[(-1.0, True)], [(-2.25, False)]], 1: [[(-3.0, False)], [(-0.5, True)]]})
    assert eval_stats.loglikelihood_gap(a, b) == 0.25
    assert eval_stats.loglikelihood_gap(a, a) == 0.0
    assert eval_stats.loglikelihood_gap(_samples({0: 1.0}, resps={0: [["7"]]}), a) is None   # texts: no gap


def test_score_rows_and_the_table():
    base = ({"acc,none": 0.5, "acc_norm,none": 0.25}, _samples({0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}))
    other = ({"acc,none": 0.75}, _samples({0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}))
    runs = {"offline": {"mc": base}, "cluster raw": {"mc": base}, "cluster int8": {"mc": other}}
    metrics = [("mc", "acc", "none"), ("mc", "acc_norm", "none"), ("gen", "exact_match", "strict")]
    rows = eval_stats.score_rows(runs, metrics, ["offline", "cluster raw", "cluster int8", "vLLM"])
    assert rows[0][:6] == ["mc", "acc", 0.5, 0.5, 0.75, None]
    assert rows[0][6].startswith("+0.250 [") and rows[0][6].endswith("(1+/0- of 4)")
    assert rows[1][4] is None and rows[1][6] is None   # no acc_norm per item: no interval
    assert rows[2] == ["gen", "exact_match (strict)", None, None, None, None, None]
    table = eval_stats.format_table(rows, ["task", "metric", "offline", "raw", "int8", "vLLM", "int8 - raw"])
    lines = table.splitlines()
    assert lines[0].split() == ["task", "metric", "offline", "raw", "int8", "vLLM", "int8", "-", "raw"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:6] == ["mc", "acc", "0.500", "0.500", "0.750", "-"]


def test_the_runner_summary_checks_raw_against_offline():
    from harness.eval import eval_runner

    def run(responses: dict[int, str]) -> dict:
        samples = _samples({i: 1.0 for i in responses}, "exact_match", "strict",
                           resps={i: [[r]] for i, r in responses.items()})
        return {"results": {"exact_match,strict": 1.0}, "samples": samples, "seconds": 1.0}

    runs = {"offline": {eval_runner.GEN: run({0: "7", 1: "Paris"})},
            "raw": {eval_runner.GEN: run({0: "7", 1: "Paris"})},
            "int8": {eval_runner.GEN: run({0: "7", 1: "Paris!"})},
            "vllm": {"skipped": "no Python with vllm"}}
    table, summary = eval_runner.summarize(runs, ["offline", "raw", "int8", "vllm"])
    assert summary["equal_to_offline"] == {
        f"raw {eval_runner.GEN}": {"equal": 2, "items": 2, "max_loglikelihood_gap": None},
        f"int8 {eval_runner.GEN}": {"equal": 1, "items": 2, "max_loglikelihood_gap": None}}
    assert "cluster raw's responses equal offline's bit for bit on 2/2 items" in table
    assert "vLLM: no Python with vllm" in table
    compact = eval_runner.compact(runs["int8"])[eval_runner.GEN]
    assert compact["items"]["exact_match,strict"] == {0: 1.0, 1: 1.0}
    assert compact["responses"] == {0: [["7"]], 1: [["Paris!"]]}
