"""The elasticity benchmark end to end on the tiny model (real processes; slow: ~3 min): the three
systems serve the phased workload; each row has its phases, the elastic cluster's planner
switches its prefill node to decode (a TPOT target no step meets makes decode hot) and the switch
shows in the decisions and the role timeline; the summary has the targets; the plot is written."""

from __future__ import annotations

import json

import pytest

from harness.bench.serve.serve_cli import run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_three_systems_serve_the_phased_workload(tmp_path, capsys):
    code = run(["--systems", "pdbus-disagg,pdbus-coloc,pdbus-elastic", "--workload", "phased", "--quick",
                "--model", "tiny", "--dtype", "float32", "--request-rates", "2", "--phase-duration-s", "10",
                "--output-scale", "0.1", "--results-dir", str(tmp_path), "--tag", "t",
                "--planner-set", "tpot_p90_target_s=0.0001", "ttft_p90_target_s=0", "slo_window_s=4"])
    assert code == 0
    summary = json.loads((tmp_path / "t-summary.json").read_text())
    rows = {r["system"]: r for r in summary["rows"]}
    assert {s: r["status"] for s, r in rows.items()} == dict.fromkeys(rows, "ok") and len(rows) == 3
    for row in rows.values():
        assert [p["phase"] for p in row["phases"]] == ["chat-1", "document", "chat-2"]
        assert all(p["sent"] > 0 and p["failed"] == 0 for p in row["phases"])
    assert rows["pdbus-coloc"]["role_timeline"][0]["both"] == 2
    elastic = rows["pdbus-elastic"]
    assert (elastic["role_timeline"][0]["prefill"], elastic["role_timeline"][0]["decode"]) == (1, 1)
    switch = next(d for d in elastic["planner_decisions"] if d["kind"] == "switch_role")
    assert (switch["node_id"], switch["role"]) == ("prefill-0", "decode") and "TPOT p90" in switch["reason"]
    assert any(step["decode"] == 2 for step in elastic["role_timeline"])
    assert [t["name"].split(": ")[1] for t in summary["elastic_targets"]] == [
        "SLO goodput / best static, every phase", "SLO goodput / worst static, whole run"]
    assert (tmp_path / "t-phases.png").stat().st_size > 0
    assert "per phase" in capsys.readouterr().out
