"""`make bench` with vLLM installed: vLLM's own server and pdbus with vLLM engines are measured as two
more lines beside the pdbus ones (a small run; the figures themselves live in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest

from harness.bench.serve.serve_cli import run
from tests.integration.vllm_helpers import requires_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.real_model, requires_vllm,
              pytest.mark.timeout(900)]


def test_bench_measures_vllm_and_pdbus_with_vllm_engines(tmp_path):
    code = run(["--systems", "vllm,pdbus-vllm", "--request-rates", "inf", "--num-prompts", "3", "--output-scale",
                "0.1", "--num-warmup", "1", "--results-dir", str(tmp_path), "--tag", "v", "--no-plot"])
    assert code == 0
    for system in ("vllm", "pdbus-vllm"):
        result = json.loads((tmp_path / f"v-{system}-inf.json").read_text())
        assert result["completed"] == 3 and result["failed"] == 0, result.get("errors")
        assert result["mean_ttft_ms"] > 0 and result["output_throughput"] > 0
    summary = json.loads((tmp_path / "v-summary.json").read_text())
    assert {r["system"]: r["status"] for r in summary["rows"]} == {"vllm": "ok", "pdbus-vllm": "ok"}
