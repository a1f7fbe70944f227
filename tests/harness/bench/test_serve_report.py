"""Report: the table (a system that did not run is one line), capacities, targets, the PNG."""

import math

from harness.bench.serve import plots, serve_report


def row(system, rate, attainment, p99_tpot, kv=None):
    return {"system": system, "status": "ok", "request_rate": rate, "request_throughput": 1.0, "output_throughput": 50,
            "median_ttft_ms": 300, "p99_ttft_ms": 900, "median_tpot_ms": 40, "p99_tpot_ms": p99_tpot,
            "p99_itl_ms": 200, "slo_attainment": attainment, "slo_goodput": attainment, "failed": 0,
            "pdbus_stages_long_prompts": kv or {}}


ROWS = [row("pdbus-disagg", "0.5", 1.0, 50, {"mean_kv_transfer_ms": 10, "mean_ttft_ms": 500}),
        row("pdbus-disagg", "1", 0.95, 60), row("pdbus-disagg", "1.5", 0.5, 300),
        row("pdbus-coloc", "0.5", 0.95, 150), row("pdbus-coloc", "1", 0.4, 400), row("pdbus-coloc", "1.5", 0.1, 900),
        {"system": "vllm", "status": "not installed"}]


def test_table_has_a_line_per_system_and_rate_and_says_not_installed():
    text = serve_report.table(ROWS)
    assert len(text.splitlines()) == 2 + len(ROWS)
    assert "| vllm | - | not installed |" in text


def test_capacities_and_targets():
    assert serve_report.capacities(ROWS) == {"pdbus-disagg": 1.0, "pdbus-coloc": 0.5, "vllm": None}
    found = {t["name"].split(",")[0].split(" at")[0]: t for t in serve_report.targets(ROWS)}
    tpot = found["p99 TPOT disagg/coloc"]
    assert math.isclose(tpot["value"], 50 / 150) and tpot["met"]
    assert found["highest rate"]["value"] == 2.0 and found["highest rate"]["met"]
    assert found["best SLO goodput"]["met"] is None and "not installed" in found["best SLO goodput"]["note"]
    assert math.isclose(found["KV transfer / mean TTFT"]["value"], 0.02)
    assert "MET" in serve_report.targets_text(serve_report.targets(ROWS))


def test_vllm_measured_without_the_pdbus_disagg_line_is_noted_not_a_crash():
    rows = [row("vllm", "1", 0.9, 80), row("pdbus-vllm", "1", 0.95, 70)]
    found = {t["name"]: t for t in serve_report.targets(rows)}
    goodput = found["best SLO goodput, disagg/vLLM"]
    assert goodput["met"] is None and goodput["note"] == "pdbus-disagg not measured"


def test_summary_and_plot(tmp_path):
    summary = serve_report.summary(ROWS, {"rates": ["0.5", "1", "1.5"]})
    assert summary["capacity_at_90pct"]["pdbus-disagg"] == 1.0 and len(summary["rows"]) == len(ROWS)
    png = plots.plot(ROWS, tmp_path / "serve.png", "test", slo_tpot_ms=100)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
