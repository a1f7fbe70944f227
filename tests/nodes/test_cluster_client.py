"""The client's delivery rules, sans I/O: indices are mapped onto the stream, duplicates dropped,
tokens after a gap held until it fills; what the bus cannot carry refused before it is sent
(nodes/wire/carriable.py: tests/nodes/wire/test_carriable.py); and, over a scripted bus, no stream
left open however a request ends."""

from __future__ import annotations

import pytest

from bus.mailbox import BusError
from nodes import wire
from nodes.cluster_client import ClusterClient, Generation
from nodes.cluster_orchestrator import Attempt, Retry, StreamToken, _retry_from, retry_delay
from nodes.engines.base import SamplingParams
from tests.nodes.gateway.fake_bus import FakeBus


class FakeGeneration:
    def __init__(self, delivered=()):
        self.prompt = (1, 2, 3)
        self.sampling = SamplingParams(temperature=0.0, max_tokens=10)
        self.tokens = [StreamToken(i, t, str(t)) for i, t in enumerate(delivered)]
        self.emitted = []

    def emit(self, token):
        self.tokens.append(token)
        self.emitted.append(token)


def test_a_resumed_attempt_continues_the_indices_and_drops_what_was_delivered():
    generation = FakeGeneration(delivered=[7, 8, 9])
    attempt = Attempt(generation, local=False, num_left=7)
    assert attempt.prompt == (1, 2, 3, 7, 8, 9) and attempt.sampling.max_tokens == 7
    attempt.deliver(0, 10, "a")   # relative index 0 of the resumed request is stream index 3
    attempt.deliver(0, 10, "a")   # a retried prefill's first token again: dropped
    assert [(t.index, t.token_id) for t in generation.emitted] == [(3, 10)]


def test_tokens_after_a_gap_wait_for_it():
    generation = FakeGeneration()
    attempt = Attempt(generation, local=False, num_left=10)
    attempt.deliver(1, 11, "b")
    attempt.deliver(2, 12, "c")
    assert generation.emitted == [] and sorted(attempt.pending) == [1, 2]
    attempt.deliver(0, 10, "a")
    assert [t.token_id for t in generation.emitted] == [10, 11, 12] and not attempt.pending


@pytest.mark.parametrize(("code", "details", "expected_s"), [
    ("node_lost", {"node_id": "decode-1"}, 0.0),      # the broker already dropped the node: at once
    ("request_lost", {}, 0.0),
    ("no_node", {}, 0.5),                              # maybe mid re-registration: wait a little
    ("kv_failed", {}, 0.2),                            # anything else: the client's retry delay
    ("full", {"retry_after_s": 1.5}, 1.5),             # the node said when
])
def test_a_retry_after_a_node_loss_goes_out_at_once_others_wait(code, details, expected_s):
    retry = _retry_from(BusError("r1", code, "why", details))
    assert retry_delay(retry, default_s=0.2) == expected_s
    assert retry_delay(Retry("stalled"), default_s=0.2) == 0.2


def test_text_prompts_need_a_tokenizer_and_empty_prompts_are_refused():
    client = ClusterClient("tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="tokenizer"):
        client.generate("hello")
    with pytest.raises(ValueError, match="empty"):
        client.generate([])
    generation = client.generate([1, 2], session_id="s", request_id="r")
    assert isinstance(generation, Generation) and (generation.session_id, generation.request_id) == ("s", "r")


class ScriptedAttempt:
    """Stands in for an Attempt: raises the scripted retries in turn, then finishes."""

    script: list = []
    runs = 0

    def __init__(self, generation, local, num_left):
        self.g = generation

    async def run(self):
        ScriptedAttempt.runs += 1
        if ScriptedAttempt.script:
            raise ScriptedAttempt.script.pop(0)
        return "length"


def scripted(monkeypatch, retries):
    import nodes.cluster_client as module
    ScriptedAttempt.script, ScriptedAttempt.runs = list(retries), 0
    monkeypatch.setattr(module, "Attempt", ScriptedAttempt)


def test_a_full_decode_node_is_backpressure_not_a_spent_retry(monkeypatch):
    import asyncio
    scripted(monkeypatch, [Retry("full", "no room", "decode-0") for _ in range(6)])
    client = ClusterClient("tcp://127.0.0.1:1", max_retries=2, retry_delay_s=0.001)
    result = asyncio.run(client.generate([1, 2]).collect())
    assert result.finish_reason == "length" and ScriptedAttempt.runs == 7   # 6 offers refused, then served
    assert result.trace.failures == ["full@decode-0"] * 6


def test_room_that_never_comes_ends_as_overloaded_not_a_hang(monkeypatch):
    import asyncio

    from nodes.cluster_client import ClusterError
    scripted(monkeypatch, [Retry("full", "no room", "decode-0") for _ in range(10_000)])
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.001, plan_timeout_s=0.05)
    with pytest.raises(ClusterError) as info:
        asyncio.run(client.generate([1, 2]).collect())
    assert info.value.code == "overloaded" and info.value.details["retry_after_s"] == 1.0


def test_full_answers_do_not_hide_real_failures_from_the_retry_budget(monkeypatch):
    import asyncio

    from nodes.cluster_client import ClusterError
    scripted(monkeypatch, [Retry("full"), Retry("stalled"), Retry("full"), Retry("stalled"), Retry("stalled")])
    client = ClusterClient("tcp://127.0.0.1:1", max_retries=2, retry_delay_s=0.001)
    with pytest.raises(ClusterError) as info:
        asyncio.run(client.generate([1, 2]).collect())
    assert info.value.code == "retries_exhausted"


def test_the_pause_between_offers_grows_to_a_cap_and_honours_the_nodes_hint(monkeypatch):
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.2)
    generation = client.generate([1, 2])
    pauses = [generation.wait_for_room(Retry("full")) for _ in range(5)]
    assert pauses == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert generation.wait_for_room(Retry("full", delay_s=3.0)) == 3.0


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
    import asyncio
    import time

    from bus.codec import ProtocolError
    from nodes.cluster_client import ClusterError
    client = ClusterClient("tcp://127.0.0.1:1", plan_timeout_s=30.0, retry_delay_s=0.5)
    client.bus = FakeBus("refuse_encoding")
    started = time.monotonic()
    with pytest.raises(ClusterError) as info:
        asyncio.run(client.generate([1, 2]).collect())
    assert info.value.code == "malformed" and time.monotonic() - started < 0.5
    assert issubclass(ProtocolError, ValueError)


async def test_every_stream_is_closed_when_a_generation_ends_any_way():
    import asyncio

    from nodes.cluster_client import ClusterError
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


async def test_a_bug_in_an_attempt_ends_the_stream_as_internal_and_leaves_no_task_exception(monkeypatch):
    import asyncio
    import gc

    from nodes.cluster_client import ClusterError
    scripted(monkeypatch, [RuntimeError("a bug")])
    loop, unhandled = asyncio.get_running_loop(), []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    with pytest.raises(ClusterError) as info:
        await ClusterClient("tcp://127.0.0.1:1").generate([1, 2]).collect()
    await asyncio.sleep(0)
    gc.collect()
    loop.set_exception_handler(None)
    assert info.value.code == "internal" and info.value.message == "RuntimeError" and not unhandled
