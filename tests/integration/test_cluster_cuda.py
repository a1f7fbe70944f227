"""A cluster whose nodes run their engines on a CUDA GPU (marked gpu; skipped where torch sees none).

Broker, one prefill and one decode node as real processes on loopback, `[engine] device = "cuda"`,
greedy, float32, raw KV: each stream equals one CPU engine's tokens (the tiny model's logit margins
are far above the GPU's float32 rounding: tests/nodes/engines/test_engine_cuda.py), the first token
comes from the prefill node and the KV crosses the data plane, so the prefill node's export from the
GPU and the decode node's import into it are on the path."""

from __future__ import annotations

import asyncio

import pytest
import torch

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


@pytest.fixture(scope="module", params=["raw", "int8"])
def cluster(request):
    with ClusterProcs(num_prefill=1, num_decode=1, model="tiny", kv_quant=request.param,
                      settings={"engine": {"device": "cuda"}}) as procs:
        yield procs


def test_streams_from_gpu_nodes_equal_one_cpu_engine(cluster, tiny):
    prompts = [tuple(tiny.tokenizer.encode(text)) for text in PROMPTS]

    async def run_all(client):
        return await asyncio.gather(*(client.generate(p, greedy(16)).collect() for p in prompts))

    with client_for(cluster) as client:
        results = asyncio.run(run_all(client))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.trace.plans == ["remote"] and result.trace.kv_wire_bytes > 0
        assert result.trace.prefill_node_ids == ["prefill-0"] and result.trace.num_failovers == 0
        if cluster.settings["kv"]["quant"] == "raw":   # int8 KV is lossy: only its streams' lengths are claimed
            assert result.token_ids == reference(tiny, prompt, greedy(16))
        assert len(result.token_ids) == 16 and result.finish_reason == "length"
