"""A generation across its attempts (nodes/cluster/generation.py), with scripted attempts: `full` is
backpressure (a growing pause, `overloaded` past the plan timeout, no retry spent), real failures
spend the retry budget, and a bug ends the stream as `internal` with no task exception left."""

from __future__ import annotations

import asyncio
import gc

import pytest

from nodes.cluster import ClusterClient, ClusterError
from nodes.cluster.retries import Retry


class ScriptedAttempt:
    """Stands in for an Attempt: raises the scripted retries in turn, then finishes."""

    script: list = []
    runs = 0

    def __init__(self, owner, spec):
        self.owner, self.spec = owner, spec

    async def run(self):
        ScriptedAttempt.runs += 1
        if ScriptedAttempt.script:
            raise ScriptedAttempt.script.pop(0)
        return "length"


def scripted(monkeypatch, retries):
    import nodes.cluster.generation as module
    ScriptedAttempt.script, ScriptedAttempt.runs = list(retries), 0
    monkeypatch.setattr(module, "Attempt", ScriptedAttempt)


def test_a_full_decode_node_is_backpressure_not_a_spent_retry(monkeypatch):
    scripted(monkeypatch, [Retry("full", "no room", "decode-0") for _ in range(6)])
    client = ClusterClient("tcp://127.0.0.1:1", max_retries=2, retry_delay_s=0.001)
    result = asyncio.run(client.generate([1, 2]).collect())
    assert result.finish_reason == "length" and ScriptedAttempt.runs == 7   # 6 offers refused, then served
    assert result.trace.failures == ["full@decode-0"] * 6


def test_room_that_never_comes_ends_as_overloaded_not_a_hang(monkeypatch):
    scripted(monkeypatch, [Retry("full", "no room", "decode-0") for _ in range(10_000)])
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.001, plan_timeout_s=0.05)
    with pytest.raises(ClusterError) as info:
        asyncio.run(client.generate([1, 2]).collect())
    assert info.value.code == "overloaded" and info.value.details["retry_after_s"] == 1.0


def test_full_answers_do_not_hide_real_failures_from_the_retry_budget(monkeypatch):
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


async def test_a_bug_in_an_attempt_ends_the_stream_as_internal_and_leaves_no_task_exception(monkeypatch):
    scripted(monkeypatch, [RuntimeError("a bug")])
    loop, unhandled = asyncio.get_running_loop(), []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    with pytest.raises(ClusterError) as info:
        await ClusterClient("tcp://127.0.0.1:1").generate([1, 2]).collect()
    await asyncio.sleep(0)
    gc.collect()
    loop.set_exception_handler(None)
    assert info.value.code == "internal" and info.value.message == "RuntimeError" and not unhandled
