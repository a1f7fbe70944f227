"""Failover with real processes on loopback (tiny model, fp32, greedy, raw KV), per
docs/CLUSTER.md: a decode node SIGKILLed or frozen mid-stream, a prefill node SIGKILLed
mid-prefill, every prefill node dead (decode-local fallback), the broker killed and restarted
mid-stream, KV that fails its checksums, and a request that exhausts its retries. In every
surviving case the client receives exactly the fault-free token ids, and no node is restarted.
Test-only flags make streams slow enough to fail in the middle and corrupt KV chunks; waits poll
with deadlines, nothing asserts on timing."""

from __future__ import annotations

import asyncio
import signal

import pytest

from harness.cluster_procs import ClusterProcs, poll_until
from nodes.cluster import ClusterError
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = pytest.mark.integration
SLOW_DECODE = {"decode": ["--test-step-delay-ms", "40"]}


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def joined_once(cluster) -> bool:
    return all(len(cluster.broker.find("node_joined", node_id=n)) == 1 for n in cluster.nodes)


async def stream_and_act(client, prompt, sampling, after: int, action):
    """Stream `prompt`; after `after` tokens call `action(generation)` once; the result."""
    generation = client.generate(prompt, sampling)
    count = 0
    async for _ in generation:
        count += 1
        if count == after:
            await asyncio.to_thread(action, generation)
    return generation.result


def test_decode_node_killed_mid_stream_resumes_exactly_on_another(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[2]))
    with ClusterProcs(num_prefill=2, num_decode=2, extra_args=SLOW_DECODE) as cluster, client_for(cluster) as client:
        killed = []

        def kill_serving(generation):
            killed.append(generation.trace.decode_node_ids[-1])
            cluster.kill(killed[0])

        result = asyncio.run(stream_and_act(client, prompt, greedy(40), 10, kill_serving))
        assert result.token_ids == reference(tiny, prompt, greedy(40))
        trace = result.trace
        assert trace.num_failovers == 1 and trace.failures == [f"node_lost@{killed[0]}"]
        assert trace.decode_node_ids[0] == killed[0] and trace.decode_node_ids[1] != killed[0]
        assert not cluster.nodes[killed[0]].alive and joined_once(cluster)   # nothing restarted


def test_prefill_node_killed_mid_prefill_is_retried_on_another(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[0]))
    delay = {"prefill": ["--test-prefill-delay-ms", "2500"]}
    with ClusterProcs(num_prefill=2, num_decode=2, extra_args=delay) as cluster, client_for(cluster) as client:
        async def run():
            generation = client.generate(prompt, greedy(8))
            task = asyncio.ensure_future(generation.collect())
            victim = await asyncio.to_thread(first_prefill_started, cluster)
            cluster.kill(victim)
            return victim, await task

        victim, result = asyncio.run(run())
        assert result.token_ids == reference(tiny, prompt, greedy(8))
        trace = result.trace
        assert trace.num_prefill_retries == 1 and trace.failures == [f"prefill_node_lost@{victim}"]
        assert trace.prefill_node_ids == [n for n in ("prefill-0", "prefill-1") if n != victim]
        assert joined_once(cluster)


def first_prefill_started(cluster, timeout: float = 30.0) -> str:
    started = poll_until(lambda: next((node_id for node_id in ("prefill-0", "prefill-1")
                                       if cluster.nodes[node_id].find("prefill_started")), None), timeout, 0.02)
    if not started:
        raise AssertionError("no prefill started")
    return started


def test_all_prefill_nodes_dead_falls_back_to_decode_local_prefill(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[3]))
    with ClusterProcs(num_prefill=1, num_decode=1) as cluster, client_for(cluster) as client:
        cluster.kill("prefill-0")
        cluster.broker.wait_for("node_left", node_id="prefill-0")
        result = client.generate_blocking(prompt, greedy(10))
        assert result.token_ids == reference(tiny, prompt, greedy(10))
        trace = result.trace
        assert trace.plans == ["remote", "local"] and trace.fallback_local and trace.prefill_node_ids == []
        assert trace.failures == ["no_prefill_node@"]


def test_broker_killed_and_restarted_mid_stream_loses_and_repeats_nothing(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[1]))
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=SLOW_DECODE) as cluster, client_for(cluster) as client:
        def restart_broker(_generation):
            cluster.restart_broker(kill=True)

        result = asyncio.run(stream_and_act(client, prompt, greedy(60), 8, restart_broker))
        # Usually the stream simply continues (routes rebuilt from READY; replies lost inside the
        # dead broker are a seq gap, filled from the FINAL's token list); if the stream ended while
        # no broker was up, the client is told request_lost and resumes. Either way: exact.
        assert result.token_ids == reference(tiny, prompt, greedy(60))
        assert all(f.startswith("request_lost@") for f in result.trace.failures)
        assert client.bus.endpoint.metrics()["link.registered"] >= 2   # the client re-registered too
        for node_id in cluster.nodes:   # the nodes re-registered with the new broker, none restarted
            cluster.broker.wait_for("node_joined", node_id=node_id)
            assert cluster.nodes[node_id].alive


def test_a_request_that_exhausts_its_retries_ends_with_a_clear_error(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[0]))
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=SLOW_DECODE) as cluster, \
            client_for(cluster, max_retries=1) as client, pytest.raises(ClusterError) as info:
        asyncio.run(stream_and_act(client, prompt, greedy(40), 3, lambda g: cluster.kill("decode-0")))
    error = info.value
    assert error.code == "retries_exhausted"
    assert error.trace.failures[0] == "node_lost@decode-0" and len(error.trace.failures) == 2


def test_frozen_decode_node_is_failed_over_then_frees_the_stale_request_on_thaw(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[3]))
    with ClusterProcs(num_prefill=1, num_decode=2, extra_args=SLOW_DECODE) as cluster, client_for(cluster) as client:
        frozen = []

        def freeze_serving(generation):
            frozen.append(generation.trace.decode_node_ids[-1])
            cluster.kill(frozen[0], signal.SIGSTOP)

        # Long enough that the thawed node is still decoding when the broker cancels the orphan.
        result = asyncio.run(stream_and_act(client, prompt, greedy(120), 10, freeze_serving))
        assert result.token_ids == reference(tiny, prompt, greedy(120))
        assert result.trace.failures == [f"node_lost@{frozen[0]}"]
        node = cluster.nodes[frozen[0]]
        node.signal(signal.SIGCONT)   # (the stream already finished elsewhere)
        cluster.broker.wait_for("node_joined", node_id=frozen[0], count=2)   # it registers again
        node.wait_for("decode_cancelled")   # and the stream nobody reads any more is freed


def test_kv_that_fails_its_checksums_is_never_decoded_and_the_prefill_is_resent(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[2]))
    faults = {"prefill": ["--test-kv-faults", "4"]}   # every attempt of the first transfer's chunk
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=faults) as cluster, client_for(cluster) as client:
        result = client.generate_blocking(prompt, greedy(10))
        decode = cluster.nodes["decode-0"]
    assert result.token_ids == reference(tiny, prompt, greedy(10))
    assert result.trace.num_prefill_retries == 1 and result.trace.failures == ["prefill_kv_failed@prefill-0"]
    failed, verified = decode.find("kv_arrived", ok=False), decode.find("kv_arrived", ok=True)
    assert len(failed) == 1 and len(verified) == 1 and failed[0]["transfer_id"] != verified[0]["transfer_id"]


def test_no_decode_node_at_all_ends_with_a_clear_error_not_a_hang(tiny):
    with ClusterProcs(num_prefill=1, num_decode=0) as cluster, client_for(cluster, max_retries=2) as client, \
            pytest.raises(ClusterError) as info:
        client.generate_blocking(tuple(tiny.tokenizer.encode(PROMPTS[0])), greedy(4))
    assert info.value.code == "retries_exhausted" and info.value.trace.failures == ["no_node@"] * 3
