"""The cluster on the real model (SmolLM2-135M-Instruct, fp32, greedy, raw KV), real processes:
a fast end-to-end stream equal to one engine's, and (slow) a decode node SIGKILLed mid-stream
with 2 prefill and 2 decode nodes, the client still receiving exactly the fault-free tokens."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import client_for, greedy, load, reference
from tests.integration.test_cluster_failover import stream_and_act

pytestmark = [pytest.mark.integration, pytest.mark.real_model]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def smollm2():
    return load(MODEL)


def chat_prompt(model, text: str) -> tuple[int, ...]:
    return tuple(model.tokenizer.encode(model.tokenizer.apply_chat_template([{"role": "user", "content": text}])))


def test_real_model_stream_equals_one_engine(smollm2):
    prompt = chat_prompt(smollm2, "What is the capital of France?")
    with ClusterProcs(num_prefill=1, num_decode=1, model=MODEL) as cluster, client_for(cluster) as client:
        result = client.generate_blocking(prompt, greedy(16))
    assert result.token_ids == reference(smollm2, prompt, greedy(16))
    assert result.trace.plans == ["remote"] and result.trace.kv_wire_bytes > 0
    assert "Paris" in smollm2.tokenizer.decode(result.token_ids)


@pytest.mark.slow
def test_real_model_decode_node_killed_mid_stream_resumes_exactly(smollm2):
    prompt = chat_prompt(smollm2, "Write a short poem about the sea.")
    slow = {"decode": ["--test-step-delay-ms", "20"]}
    with ClusterProcs(num_prefill=2, num_decode=2, model=MODEL, extra_args=slow) as cluster, \
            client_for(cluster) as client:
        killed = []

        def kill_serving(generation):
            killed.append(generation.trace.decode_node_ids[-1])
            cluster.kill(killed[0])

        result = asyncio.run(stream_and_act(client, prompt, greedy(40), 10, kill_serving))
    assert result.token_ids == reference(smollm2, prompt, greedy(40))
    assert result.trace.num_failovers == 1 and result.trace.failures == [f"node_lost@{killed[0]}"]
