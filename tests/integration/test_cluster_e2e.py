"""End to end through real processes on loopback: broker, prefill and decode nodes, ClusterClient.

Greedy, fp32, raw (lossless) KV: the cluster's tokens equal one engine's. Multi-turn: a short
second turn on the same session is prefilled on the decode node on top of its cached KV and moves
no KV bytes over the data plane (asserted on the nodes' own counters in the FINAL bodies), on
the same one of two decode nodes."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


@pytest.fixture(scope="module")
def cluster():
    with ClusterProcs(num_prefill=1, num_decode=2, model="tiny", kv_quant="raw") as procs:
        yield procs


def test_stream_equals_one_engine_and_first_token_comes_from_prefill(cluster, tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[0]))
    with client_for(cluster) as client:
        result = client.generate_blocking(prompt, greedy(12))
    assert result.token_ids == reference(tiny, prompt, greedy(12))
    assert result.finish_reason == "length"
    trace = result.trace
    assert trace.plans == ["remote"] and trace.prefill_node_ids == ["prefill-0"]
    assert trace.decode_node_ids[0] in ("decode-0", "decode-1")
    assert trace.num_failovers == 0 and trace.kv_wire_bytes > 0
    assert {"plan_s", "prefill_s", "kv_transfer_s", "decode_queue_s", "decode_s", "ttft_s", "total_s"} <= set(trace.timings)


def test_concurrent_streams_are_each_exact(cluster, tiny):
    prompts = [tuple(tiny.tokenizer.encode(text)) for text in PROMPTS]

    async def run_all(client):
        generations = [client.generate(p, greedy(10)) for p in prompts]
        return await asyncio.gather(*(g.collect() for g in generations))

    with client_for(cluster) as client:
        results = asyncio.run(run_all(client))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == reference(tiny, prompt, greedy(10))
        assert [t for t in result.token_ids] and result.usage["completion_tokens"] == 10


def test_short_second_turn_moves_no_kv_and_prefills_only_the_suffix(cluster, tiny):
    first_prompt = tuple(tiny.tokenizer.encode(PROMPTS[1]))
    with client_for(cluster) as client:
        first = client.generate_blocking(first_prompt, greedy(8), session_id="chat-1")
        suffix = tuple(tiny.tokenizer.encode(" and then?"))
        second_prompt = first_prompt + tuple(first.token_ids) + suffix
        second = client.generate_blocking(second_prompt, greedy(8), session_id="chat-1")
    before, after = first.trace.decode_final["stats"], second.trace.decode_final["stats"]
    # The scheduler keeps the session on its decode node (of two), which still holds its KV.
    assert second.trace.decode_node_ids == first.trace.decode_node_ids
    assert second.trace.plans == ["cached"] and second.trace.prefill_node_ids == []
    assert after["kv_wire_bytes"] == 0 and after["node_kv_bytes_received"] == before["node_kv_bytes_received"]
    # The engine caches every token whose KV it computed: the prompt and all outputs but the last.
    num_cached = len(first_prompt) + len(first.token_ids) - 1
    assert after["num_cached_tokens"] == num_cached
    assert after["node_prefilled_tokens"] - before["node_prefilled_tokens"] == len(second_prompt) - num_cached
    assert second.token_ids == reference(tiny, second_prompt, greedy(8))


def test_every_node_logs_the_dtype_its_engine_runs_in(cluster):
    """`[engine] dtype = "auto"` is resolved per machine: the start-up line says what it chose, and
    which kernels serve (kernels.dispatch) on which CPU features (kernels.cpu)."""
    for node in cluster.nodes.values():
        started = [e for e in node.events if e.get("event") == "node_started"]
        assert started and started[0]["dtype"] == "float32", node   # ClusterProcs runs float32
        # The engine's kernel plan and the CPU probe, in the same line.
        assert set(started[0]["kernels"]) >= {"linear", "decode_attention", "prefill_attention", "kv_int8"}
        assert "numba" in started[0]["cpu_features"]
