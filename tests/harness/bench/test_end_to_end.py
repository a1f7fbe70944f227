"""A tiny real run: `pdbus bench` against a real `pdbus cluster --model tiny` (broker, prefill and
decode node processes, the gateway), a handful of requests over SSE; vLLM's line says not installed."""

import importlib.util
import json

import pytest

from harness.bench.serve.serve_cli import run
from harness.bench.serve.systems import PdbusSystem, SystemUnavailable, VllmSystem

pytestmark = pytest.mark.integration


def test_bench_measures_a_real_tiny_cluster_and_writes_vllm_keyed_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(VllmSystem, "available", lambda self: False)   # as on a machine without vLLM
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
    speed = result["vm_speed"]                       # the VM's rate as the system started and after it stopped
    assert speed["before"]["bf16_tflops"] > 0 and speed["after"]["fp32_tflops"] > 0
    assert summary["vm_speed_drift"] >= 1.0
    out = capsys.readouterr().out
    assert "not installed" in out and "VM matmul rate" in out


def test_without_vllm_both_vllm_lines_say_not_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    system = VllmSystem()
    assert not system.available()
    with pytest.raises(SystemUnavailable, match="not installed"):
        system.start()
    assert not PdbusSystem("pdbus-vllm", colocated=False, engine="vllm").available()
    assert PdbusSystem("pdbus-disagg", colocated=False).available()


def test_vllm_server_is_started_the_way_that_works_here(tmp_path):
    argv = VllmSystem(dtype="bfloat16").argv(tmp_path / "SmolLM2", "SmolLM2", 8123)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]   # not the broken console script
    assert {"--enforce-eager", "--no-enable-prefix-caching"} <= set(argv)
    assert argv[argv.index("--served-model-name") + 1] == "SmolLM2" and argv[argv.index("--port") + 1] == "8123"
