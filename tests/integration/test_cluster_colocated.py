"""`pdbus node --role both` (one engine, chunked prefill interleaved with decode), `pdbus
complete` through real processes, and node commands that cannot start."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from harness.cluster_procs import REPO_ROOT, ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def test_colocated_node_serves_concurrent_streams_exactly_with_no_kv_moved(tiny):
    prompts = [tuple(tiny.tokenizer.encode(text * 3)) for text in PROMPTS]   # several prefill chunks
    settings = {"decode": {"prefill_chunk_tokens": 16}}
    with ClusterProcs(num_prefill=0, num_decode=0, num_both=1, settings=settings) as cluster, \
            client_for(cluster) as client:
        async def run_all():
            return await asyncio.gather(*(client.generate(p, greedy(12)).collect() for p in prompts))
        results = asyncio.run(run_all())
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == reference(tiny, prompt, greedy(12))
        assert result.trace.plans == ["local"] and result.trace.decode_node_ids == ["both-0"]
        assert result.trace.prefill_node_ids == [] and result.trace.decode_final["stats"]["kv_wire_bytes"] == 0


def test_complete_command_streams_through_the_cluster(tiny):
    prompt = "Once upon a time"
    expected = reference(tiny, tuple(tiny.tokenizer.encode(prompt)), greedy(8))
    with ClusterProcs(num_prefill=1, num_decode=1) as cluster:
        run = subprocess.run([sys.executable, "-m", "nodes.cli", "complete", "--config", str(cluster.config_path),
                              "--prompt", prompt, "--max-tokens", "8", "--log-level", "warning"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip("\n") == tiny.tokenizer.decode(expected)
    summary = run.stderr.strip().splitlines()[-1]
    assert "8 generated" in summary and "TTFT" in summary and "tok/s" in summary and "decode decode-0" in summary


def test_complete_command_without_a_broker_fails_with_one_line(tmp_path):
    config = tmp_path / "none.toml"
    config.write_text('[broker]\nendpoint = "tcp://127.0.0.1:9"\n[engine]\nmodel = "tiny"\n')
    run = subprocess.run([sys.executable, "-m", "nodes.cli", "complete", "--config", str(config), "--prompt", "hi",
                          "--timeout", "1", "--log-level", "error"], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "did not answer" in run.stderr


def test_a_node_whose_model_cannot_load_exits_2_with_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "nodes.cli", "decode", "--model", str(tmp_path / "missing.gguf"),
                          "--broker", "tcp://127.0.0.1:9", "--log-level", "error"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.startswith("pdbus decode: ") and "missing.gguf" in run.stderr
