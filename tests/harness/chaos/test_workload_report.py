"""The seeded workload and the run's table / JSON."""

from __future__ import annotations

import json

from harness.chaos.chaos_report import render_markdown, render_table, write_json
from harness.chaos.chaos_workload import LOWEST_PROMPT_ID, build_workload


def test_the_workload_is_the_same_for_a_seed_and_stays_inside_the_vocabulary():
    first, again = build_workload(7, 5, 16, 8, 512), build_workload(7, 5, 16, 8, 512)
    assert first == again and first != build_workload(8, 5, 16, 8, 512)
    assert [s.name for s in first] == ["r000", "r001", "r002", "r003", "r004"]
    assert all(len(s.prompt_token_ids) == 16 and s.max_tokens == 8 for s in first)
    assert all(LOWEST_PROMPT_ID <= t < 512 for s in first for t in s.prompt_token_ids)


ROW = {"scenario": "kill-decode", "ok": False, "num_ok": 7, "num_failed": 1,
       "tokens": {"identical": False, "num_identical": 6, "num_compared": 7, "exact_ids": True},
       "latency_fault_free": {"p50_s": 1.0, "p99_s": 1.2}, "latency_faulted": {"p50_s": 1.1, "p99_s": None},
       "recovery_p99_s": 0.95, "recovery_bound_s": 2.25, "problems": ["r003 lost: timeout"]}


def test_the_table_shows_each_scenario_and_its_problems():
    text = render_table([ROW])
    assert "kill-decode" in text and "FAILED" in text and "7/1" in text and "NO 6/7 ids" in text
    assert "1.10/-" in text and "0.95 (<= 2.25)" in text and "problems: r003 lost: timeout" in text
    assert render_markdown([ROW]).count("|") > 8


def test_the_run_is_written_as_json(tmp_path):
    path = write_json({"rows": [ROW]}, tmp_path / "results")
    assert path.parent == tmp_path / "results" and path.name.startswith("chaos-")
    assert json.loads(path.read_text())["rows"][0]["scenario"] == "kill-decode"
