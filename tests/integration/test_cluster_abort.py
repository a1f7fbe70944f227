"""Abort frees the request's KV on both nodes (real processes): cancelled while the prefill runs,
the decode node releases its reservation and the prefill node drops the prompt (or aborts its
send); cancelled mid-decode, or by a client process that is SIGKILLed (the broker's CANCEL
client_lost), the decode node's free KV blocks return to their baseline."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from harness.cluster_procs import ClusterProcs, Proc
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def kv_blocks_free(node) -> int:
    return [e for e in node.events if e.get("event") in ("node_started", "capacity_updated")][-1]["capacity"]["kv_blocks_free"]


def test_abort_during_prefill_frees_the_reservation_and_drops_the_prompt(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[0]))
    delay = {"prefill": ["--test-prefill-delay-ms", "1500"]}
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=delay) as cluster, client_for(cluster) as client:
        decode, prefill = cluster.nodes["decode-0"], cluster.nodes["prefill-0"]
        baseline = kv_blocks_free(decode)

        async def run():
            generation = client.generate(prompt, greedy(16))
            task = asyncio.ensure_future(generation.collect())
            await asyncio.to_thread(prefill.wait_for, "prefill_started")
            # Admitted: blocks reserved for the KV (the node's capacity log line may trail the plan).
            await asyncio.to_thread(wait_until, lambda: kv_blocks_free(decode) < baseline, 10.0,
                                    message="decode blocks reserved")
            await generation.aclose()
            await asyncio.gather(task, return_exceptions=True)
            return generation

        generation = asyncio.run(run())
        assert generation.result is None   # aborted: no result
        assert decode.wait_for("decode_cancelled")["stage"] == "kv_wait"
        assert prefill.wait_for("prefill_cancelled")["transfer_id"]
        wait_until(lambda: kv_blocks_free(decode) == baseline, message="decode KV back to baseline")
        assert not decode.find("kv_arrived", ok=True)   # the dropped prompt never sent its KV


def test_abort_mid_decode_returns_the_blocks(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[1]))
    slow = {"decode": ["--test-step-delay-ms", "40"]}
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=slow) as cluster, client_for(cluster) as client:
        decode = cluster.nodes["decode-0"]
        baseline = kv_blocks_free(decode)

        async def run():
            generation = client.generate(prompt, greedy(200))
            count = 0
            async for _ in generation:
                count += 1
                if count == 5:
                    await generation.aclose()
            return count

        assert asyncio.run(run()) == 5
        assert decode.wait_for("decode_cancelled")["stage"] == "decode"
        wait_until(lambda: kv_blocks_free(decode) == baseline, message="decode KV back to baseline")


CLIENT = """
import asyncio, sys
from bus.log import configure_logging, get_logger
from nodes.cluster import ClusterClient
from nodes.engines.base import SamplingParams
configure_logging("json", "info")

async def main():
    async with ClusterClient(sys.argv[1]) as client:
        count = 0
        async for _ in client.generate([5, 6, 7, 8, 9, 10, 11, 12], SamplingParams(temperature=0, max_tokens=500)):
            count += 1
            if count == 3:
                get_logger("test_client").info("streaming")
asyncio.run(main())
"""


def test_a_client_killed_mid_stream_gets_its_kv_freed(tiny):
    slow = {"decode": ["--test-step-delay-ms", "40"]}
    with ClusterProcs(num_prefill=1, num_decode=1, extra_args=slow) as cluster:
        decode = cluster.nodes["decode-0"]
        baseline = kv_blocks_free(decode)
        client = Proc([sys.executable, "-c", CLIENT, cluster.broker_endpoint])
        try:
            client.wait_for("streaming")
            client.signal(signal.SIGKILL)
            assert decode.wait_for("decode_cancelled")["stage"] == "decode"   # CANCEL client_lost
            wait_until(lambda: kv_blocks_free(decode) == baseline, message="decode KV back to baseline")
        finally:
            client.stop()
