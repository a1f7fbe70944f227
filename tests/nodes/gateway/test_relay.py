"""The bounded per-stream relay (nodes/gateway/relay.py) with a fake generation: order, end,
errors passed through, a stalled consumer cut off with the generation aborted."""

import asyncio

import pytest

from nodes.cluster import StreamToken
from nodes.gateway.relay import Relay, StalledConsumer


class FakeGeneration:
    def __init__(self, num_tokens: int, error: Exception | None = None) -> None:
        self.num_tokens, self.error = num_tokens, error
        self.result = None
        self.closed = False
        self.num_made = 0

    def __aiter__(self):
        return self._tokens()

    async def _tokens(self):
        for index in range(self.num_tokens):
            self.num_made += 1
            yield StreamToken(index, index, f"t{index}")
            await asyncio.sleep(0)
        if self.error:
            raise self.error
        self.result = "done"

    async def aclose(self):
        self.closed = True


async def test_tokens_come_through_in_order_then_the_result():
    relay = Relay(FakeGeneration(5), max_buffered=2, stall_timeout_s=5)
    assert [t.text async for t in relay] == [f"t{i}" for i in range(5)]
    assert relay.result == "done"


async def test_an_error_of_the_generation_reaches_the_consumer():
    relay = Relay(FakeGeneration(2, ValueError("boom")), max_buffered=4, stall_timeout_s=5)
    seen = []
    with pytest.raises(ValueError, match="boom"):
        async for token in relay:
            seen.append(token.index)
    assert seen == [0, 1]


async def test_a_consumer_that_stops_reading_is_cut_off_and_the_generation_aborted():
    generation = FakeGeneration(1000)
    relay = Relay(generation, max_buffered=3, stall_timeout_s=0.05)
    iterator = relay.__aiter__()
    await iterator.__anext__()
    await asyncio.sleep(0.2)   # the consumer stalls; the pump waits on a full buffer, then gives up
    assert relay.stalled and generation.closed
    assert generation.num_made <= 6   # the buffer bounded what was pulled from the cluster
    with pytest.raises(StalledConsumer):
        async for _ in iterator:
            pass


async def test_aclose_ends_a_consumer_still_iterating():
    relay = Relay(FakeGeneration(1000), max_buffered=2, stall_timeout_s=5)
    iterator = relay.__aiter__()
    await iterator.__anext__()
    await relay.aclose()
    assert relay.generation.closed
    remaining = [t async for t in iterator]
    assert len(remaining) <= 2
