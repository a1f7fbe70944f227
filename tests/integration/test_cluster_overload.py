"""Bounded overload through real processes: a request that finds every decode node full waits in
the broker queue for its plan; with every decode node full and no broker queue, the
client's request ends at once with ClusterError `overloaded` carrying the scheduler's retry-after
hint (the gateway maps it to HTTP 503), and the running stream is untouched."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from nodes.cluster import ClusterError
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = pytest.mark.integration


def test_full_cluster_answers_overloaded_with_a_retry_hint():
    tiny = load("tiny")
    first, second = (tuple(tiny.tokenizer.encode(text)) for text in PROMPTS[:2])
    settings = {"decode": {"max_num_seqs": 1}, "scheduler": {"queue_size": 0, "retry_after_s": 2.5}}
    slow = {"decode": ["--test-step-delay-ms", "40"]}
    with ClusterProcs(num_prefill=1, num_decode=1, settings=settings, extra_args=slow) as cluster, \
            client_for(cluster) as client:
        async def run():
            running = client.generate(first, greedy(30))
            iterator = aiter(running)
            await anext(iterator)                       # the only decode slot is taken
            with pytest.raises(ClusterError) as info:
                await client.generate(second, greedy(4)).collect()
            rest = [token async for token in iterator]
            return info.value, running.result, len(rest)

        error, result, num_rest = asyncio.run(run())
    assert error.code == "overloaded" and error.details["retry_after_s"] == 2.5
    assert error.trace.failures == ["overloaded@"]
    assert result.token_ids == reference(tiny, first, greedy(30)) and num_rest == 29


def test_a_request_that_finds_the_cluster_full_waits_in_the_queue_then_streams_exactly():
    tiny = load("tiny")
    first, second = (tuple(tiny.tokenizer.encode(text)) for text in PROMPTS[2:4])
    settings = {"decode": {"max_num_seqs": 1}}   # the default queue holds the second request
    slow = {"decode": ["--test-step-delay-ms", "40"]}
    with ClusterProcs(num_prefill=1, num_decode=1, settings=settings, extra_args=slow) as cluster, \
            client_for(cluster, stall_timeout_s=1.0, plan_timeout_s=60.0) as client:
        async def run():
            running = client.generate(first, greedy(50))
            iterator = aiter(running)
            await anext(iterator)
            queued = asyncio.ensure_future(client.generate(second, greedy(6)).collect())
            await running.collect()
            return running.result, await queued

        first_result, second_result = asyncio.run(run())
    assert first_result.token_ids == reference(tiny, first, greedy(50))
    # It waited (~2 s, longer than the 1 s stall timeout) for its plan without a retry.
    assert second_result.token_ids == reference(tiny, second, greedy(6)) and second_result.trace.failures == []
