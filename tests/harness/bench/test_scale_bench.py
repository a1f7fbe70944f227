"""`make bench-scale` end to end on a tiny load: real broker, load-generator and client processes
(and for the slow test the real gateway), both paths, every results file written."""

from __future__ import annotations

import json

import pytest

from harness.bench import scale_bench

pytestmark = pytest.mark.integration


def run(tmp_path, *args: str) -> dict:
    assert scale_bench.main(["--quick", "--seconds", "1", "--streams-per-node", "8", "--max-tokens", "32",
                             "--out-dir", str(tmp_path), "--tag", "scale-smoke", *args]) == 0
    summary = json.loads((tmp_path / "scale-smoke-summary.json").read_text())
    assert list(tmp_path.glob("scale-smoke-*.png"))
    return summary


def test_a_quick_run_on_the_bus_relays_every_offered_token(tmp_path, capsys):
    summary = run(tmp_path, "--nodes", "2", "--skip", "rate,half,http")
    rows = json.loads(next(tmp_path.glob("scale-smoke-2*.json")).read_text())["rows"]
    nodes = [r for r in rows if r["section"] == "nodes"]
    assert {r["path"] for r in nodes} == {"batched", "per-token"} and not any(r.get("failed") for r in nodes)
    for r in nodes:   # 2 nodes x 8 streams every 20 ms: 800 tokens/s, all of it relayed
        assert r["tokens_per_s"] == pytest.approx(800, rel=0.15) and r["p99_ms"] < 200
        assert not r["client_counters"].get("out_of_order") and r["broker_us_per_token"] > 0
    assert {r["path"] for r in rows if r["section"] == "ceiling"} == {"batched", "per-token"}
    assert summary["broker_alone"]["batched"]["tokens_per_s"] > summary["broker_alone"]["per-token"]["tokens_per_s"]
    assert "targets:" in capsys.readouterr().out


@pytest.mark.slow
def test_a_quick_run_through_the_gateway(tmp_path):
    summary = run(tmp_path, "--skip", "ceiling,rate,half,nodes")
    for path in ("batched", "per-token"):
        (http,) = summary["http"][path]
        assert http["tokens_per_s"] == pytest.approx(3200, rel=0.15) and http["gateway_cpu_frac"] > 0
