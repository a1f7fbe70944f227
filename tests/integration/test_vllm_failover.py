"""Failover with vLLM engines behind the nodes: a decode node SIGKILLed mid-stream, the stream resumes
on the other decode node (re-prefilled by the vLLM prefill node, its KV shipped over pdbus) and the
client receives plain vLLM's greedy tokens, none missing or repeated. fp32 and raw KV, so the resumed
prefill of prompt + delivered tokens computes what the uninterrupted stream did."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import client_for, greedy
from tests.integration.test_cluster_failover import stream_and_act
from tests.integration.vllm_helpers import MODEL, plain_vllm, requires_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.real_model, requires_vllm,
              pytest.mark.timeout(600)]
VLLM_FP32 = {"engine": {"kind": "vllm", "dtype": "float32", "num_threads": 1}}


def test_decode_node_killed_mid_stream_resumes_on_the_other_with_plain_vllm_tokens():
    from nodes.engines.model_loader import open_model_folder

    prompt = tuple(open_model_folder(MODEL).tokenizer.encode("Write a short poem about the sea and the wind."))
    expected = plain_vllm([prompt], 32, dtype="float32")[0]
    slow = {"decode": ["--test-step-delay-ms", "30"]}
    with ClusterProcs(num_prefill=1, num_decode=2, model=MODEL, kv_quant="raw", settings=VLLM_FP32,
                      extra_args=slow) as cluster, client_for(cluster) as client:
        killed = []

        def kill_serving(generation):
            killed.append(generation.trace.decode_node_ids[-1])
            cluster.kill(killed[0])

        result = asyncio.run(stream_and_act(client, prompt, greedy(32), 8, kill_serving))
    assert result.trace.num_failovers == 1 and result.trace.failures == [f"node_lost@{killed[0]}"]
    assert result.trace.decode_node_ids[-1] != killed[0]
    assert result.token_ids == expected
