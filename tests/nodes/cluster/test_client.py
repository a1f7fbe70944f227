"""The cluster client's front door (nodes/cluster/client.py): text prompts need a tokenizer, what the
bus cannot carry is refused before it is sent (nodes/wire/carriable.py: tests/nodes/wire/test_carriable.py),
an encoding refusal ends the request at once; and, over a scripted bus, no stream is left open
however a request ends."""

from __future__ import annotations

import asyncio
import time

import pytest

from bus.codec import ProtocolError
from nodes import wire
from nodes.cluster import ClusterClient, ClusterError, Generation
from nodes.engines.base import SamplingParams
from tests.nodes.gateway.fake_bus import FakeBus


def test_text_prompts_need_a_tokenizer_and_empty_prompts_are_refused():
    client = ClusterClient("tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="tokenizer"):
        client.generate("hello")
    with pytest.raises(ValueError, match="empty"):
        client.generate([])
    generation = client.generate([1, 2], session_id="s", request_id="r")
    assert isinstance(generation, Generation) and (generation.session_id, generation.request_id) == ("s", "r")


@pytest.mark.parametrize(("options", "path"), [
    ({"session_id": "s" * 129}, "session_id"),
    ({"session_id": "\ud800"}, "session_id"),
    ({"sampling": SamplingParams(stop=("ok", "\udfff"))}, "sampling.stop[1]"),
    ({"sampling": SamplingParams(seed=2 ** 70)}, "sampling.seed"),
    ({"sampling": SamplingParams(temperature=float("nan"))}, "sampling.temperature"),
    ({"prompt": [1, 2 ** 64]}, "prompt_token_ids[1]"),
])
def test_a_request_the_bus_cannot_carry_is_refused_before_anything_is_sent(options, path):
    client = ClusterClient("tcp://127.0.0.1:1")
    client.bus = FakeBus()
    options = dict(options)
    prompt = options.pop("prompt", [1, 2])
    with pytest.raises(wire.Uncarriable) as info:
        client.generate(prompt, options.pop("sampling", None), **options)
    assert info.value.path == path and isinstance(info.value, ValueError) and not client.bus.sent


def test_an_encoding_error_raised_by_stream_ends_the_request_at_once_as_malformed():
    client = ClusterClient("tcp://127.0.0.1:1", plan_timeout_s=30.0, retry_delay_s=0.5)
    client.bus = FakeBus("refuse_encoding")
    started = time.monotonic()
    with pytest.raises(ClusterError) as info:
        asyncio.run(client.generate([1, 2]).collect())
    assert info.value.code == "malformed" and time.monotonic() - started < 0.5
    assert issubclass(ProtocolError, ValueError)


async def test_every_stream_is_closed_when_a_generation_ends_any_way():
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.01)
    client.bus = bus = FakeBus("slow")
    sampling = SamplingParams(max_tokens=50)
    generation = client.generate([1, 2], sampling)
    assert (await anext(generation)).index == 0
    await generation.aclose()                                    # aborted mid-stream
    bus.mode = "error"
    with pytest.raises(ClusterError):
        await client.generate([1, 2], sampling).collect()       # the node refused it mid-stream
    bus.mode = "ok"
    await client.generate([1, 2], SamplingParams(max_tokens=3)).collect()   # served
    client.generate([1, 2])                                     # never iterated
    await asyncio.sleep(0.1)
    assert bus.open == {} and not bus.tasks
