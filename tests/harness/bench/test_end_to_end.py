"""A tiny real run: `pdbus bench` against a real `pdbus cluster --model tiny` (broker, prefill and
decode node processes, the gateway), a handful of requests over SSE; vLLM's line says not installed."""

import importlib.util
import json

import pytest

from harness.bench.serve.cli import run
from harness.bench.serve.systems import SystemUnavailable, VllmSystem

pytestmark = pytest.mark.integration


def test_bench_measures_a_real_tiny_cluster_and_writes_vllm_keyed_json(tmp_path, capsys):
    code = run(["--model", "tiny", "--dtype", "float32", "--systems", "pdbus-disagg,vllm", "--request-rates", "inf",
                "--num-prompts", "4", "--output-scale", "0.05", "--num-warmup", "1", "--results-dir", str(tmp_path),
                "--tag", "t", "--goodput", "ttft:60000", "tpot:60000"])
    assert code == 0
    result = json.loads((tmp_path / "t-pdbus-disagg-inf.json").read_text())
    assert result["completed"] == 4 and result["failed"] == 0, result["errors"]
    # ignore_eos: exactly max_tokens (chats 128 x 0.05 -> 6, documents 64 x 0.05 -> 3)
    assert set(result["output_lens"]) <= {3, 6} and len(result["output_lens"]) == 4
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert result["mean_ttft_ms"] > 0 and result["p99_tpot_ms"] > 0 and result["pdbus_stages"]["mean_prefill_ms"] >= 0
    summary = json.loads((tmp_path / "t-summary.json").read_text())
    assert {r["system"]: r["status"] for r in summary["rows"]} == {"pdbus-disagg": "ok", "vllm": "not installed"}
    assert (tmp_path / "t.png").stat().st_size > 0
    assert "not installed" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_system_is_a_stub_that_says_not_installed():
    system = VllmSystem()
    assert not system.available()
    with pytest.raises(SystemUnavailable, match="not installed"):
        system.start()
