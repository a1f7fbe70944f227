"""An attempt's delivery rules, sans I/O (nodes/cluster/attempt.py): indices are mapped onto the
stream from where the generation stood, duplicates dropped, tokens after a gap held until it fills.
The attempt sees only its `AttemptOwner`; here a list stands in for the generation."""

from __future__ import annotations

import time

from nodes.cluster import ClusterClient, RequestTrace, StreamToken
from nodes.cluster.attempt import Attempt
from nodes.cluster.attempt_inputs import AttemptOwner, AttemptSpec, PrefillBacklog
from nodes.engines.base import SamplingParams
from nodes.wire import TokenBody


class Delivered:
    """An `AttemptOwner` that keeps what it is handed."""

    def __init__(self, delivered=()):
        self.trace = RequestTrace("r", "s")
        self.emitted = [StreamToken(i, t, str(t)) for i, t in enumerate(delivered)]
        self._backlog = PrefillBacklog()

    @property
    def num_delivered(self):
        return len(self.emitted)

    def emit(self, token):
        self.emitted.append(token)

    def spend_retry(self, code, message, node_id=""):
        raise AssertionError("no retry here")

    def bounce_off_drain(self):
        raise AssertionError("no drain here")

    prompt_logprobs = ()

    def keep_prompt_logprobs(self, values):
        self.prompt_logprobs = self.prompt_logprobs or values

    @property
    def prefill_backlog(self):
        return self._backlog

    def open_stream(self, service, body, key=""):
        raise AssertionError("no bus here")


def spec(base=0, max_tokens=10):
    return AttemptSpec("r", "s", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=max_tokens), base,
                       local=False, plan_timeout_s=1.0, retry_delay_s=0.1)


def test_the_next_attempt_resumes_from_what_was_delivered():
    generation = ClusterClient("tcp://127.0.0.1:1").generate([1, 2, 3], SamplingParams(max_tokens=10))
    for index, token_id in enumerate([7, 8, 9]):
        generation.emit(StreamToken(index, token_id, str(token_id)))
    resumed = generation.attempt_spec(local=True)
    assert resumed.prompt == (1, 2, 3, 7, 8, 9) and resumed.sampling.max_tokens == 7
    assert resumed.base == 3 and resumed.local and resumed.session_id == generation.session_id
    assert isinstance(generation, AttemptOwner) and isinstance(Delivered(), AttemptOwner)


def test_a_resumed_attempt_continues_the_indices_and_drops_what_was_delivered():
    owner = Delivered(delivered=[7, 8, 9])
    attempt = Attempt(owner, spec(base=3, max_tokens=7))
    attempt.deliver(TokenBody(0, 10, "a"))   # relative index 0 of the resumed request is stream index 3
    attempt.deliver(TokenBody(0, 10, "a"))   # a retried prefill's first token again: dropped
    assert [(t.index, t.token_id) for t in owner.emitted[3:]] == [(3, 10)]


def test_tokens_after_a_gap_wait_for_it():
    owner = Delivered()
    attempt = Attempt(owner, spec())
    attempt.deliver(TokenBody(1, 11, "b"))
    attempt.deliver(TokenBody(2, 12, "c"))
    assert owner.emitted == [] and sorted(attempt.pending) == [1, 2]
    attempt.deliver(TokenBody(0, 10, "a"))
    assert [t.token_id for t in owner.emitted] == [10, 11, 12] and not attempt.pending


# -- a FINAL that repeats only recent tokens (nodes/decode_jobs.unconfirmed_tokens) -------------
def lossy_decode(lost: set[int], repeated_from: int):
    """Plans local, streams every token but those in `lost` (its first request only: a loss is
    a broker's accident, not the node's habit), then a FINAL repeating only the tokens from
    `repeated_from` on (as a decode node does for tokens older than its window)."""
    from bus.messages import Final, Partial
    from tests.nodes.cluster.scripted_bus import decode_done, first_id, token

    calls = []

    async def node(bus, put, body, rid):
        prompt, num_tokens = body["prompt_token_ids"], body["sampling"]["max_tokens"]
        calls.append(rid)
        put(Partial(rid, 0, {"type": "plan", "plan": "local", "node_id": "decode-lossy"}))
        for index in range(num_tokens):
            if index not in lost or len(calls) > 1:
                put(Partial(rid, index + 1, token(index, first_id(len(prompt) + index))))
        done = decode_done(prompt, num_tokens, "decode-lossy")
        done["tokens"] = [t for t in done["tokens"] if t[0] >= repeated_from]
        put(Final(rid, num_tokens + 1, done))
    return node


async def run_one(bus):
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.001, stall_timeout_s=2.0, plan_timeout_s=2.0)
    client.bus = bus
    generation = client.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=6), session_id="s1")
    return await generation.collect()


async def test_a_token_lost_inside_the_finals_window_is_repaired_by_the_final():
    from tests.nodes.cluster.scripted_bus import ClusterBus, expected, good_decode
    result = await run_one(ClusterBus(home=lossy_decode({4}, repeated_from=3), spare=good_decode()))
    assert result.token_ids == expected([1, 2, 3], 6) and result.trace.failures == []


async def test_a_token_lost_before_the_finals_window_resumes_exactly_from_the_gap():
    from tests.nodes.cluster.scripted_bus import ClusterBus, expected, good_decode
    for lost in ({1}, {5}):   # in the middle (later tokens held), or the last one (nothing held)
        result = await run_one(ClusterBus(home=lossy_decode(lost, repeated_from=6), spare=good_decode()))
        assert result.token_ids == expected([1, 2, 3], 6)
        assert [f.split("@")[0] for f in result.trace.failures] == ["gap"]


def test_after_no_prefill_node_the_client_asks_for_local_prefills_for_a_moment():
    client = ClusterClient("tcp://127.0.0.1:1")
    generation = client.generate([1, 2, 3], SamplingParams(max_tokens=4))
    assert not generation.attempt_spec(local=False).local
    client.no_prefill_node_until = time.monotonic() + 60
    assert client.generate([1, 2, 3], SamplingParams(max_tokens=4)).attempt_spec(local=False).local
