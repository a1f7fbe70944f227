"""An attempt's delivery rules, sans I/O (nodes/cluster/attempt.py): indices are mapped onto the
stream from where the generation stood, duplicates dropped, tokens after a gap held until it fills.
The attempt sees only its `AttemptOwner`; here a list stands in for the generation."""

from __future__ import annotations

from nodes.cluster import ClusterClient, RequestTrace, StreamToken
from nodes.cluster.attempt import Attempt, AttemptOwner, AttemptSpec
from nodes.engines.base import SamplingParams


class Delivered:
    """An `AttemptOwner` that keeps what it is handed."""

    def __init__(self, delivered=()):
        self.trace = RequestTrace("r", "s")
        self.emitted = [StreamToken(i, t, str(t)) for i, t in enumerate(delivered)]

    @property
    def num_delivered(self):
        return len(self.emitted)

    def emit(self, token):
        self.emitted.append(token)

    def spend_retry(self, code, message, node_id=""):
        raise AssertionError("no retry here")

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
    attempt.deliver(0, 10, "a")   # relative index 0 of the resumed request is stream index 3
    attempt.deliver(0, 10, "a")   # a retried prefill's first token again: dropped
    assert [(t.index, t.token_id) for t in owner.emitted[3:]] == [(3, 10)]


def test_tokens_after_a_gap_wait_for_it():
    owner = Delivered()
    attempt = Attempt(owner, spec())
    attempt.deliver(1, 11, "b")
    attempt.deliver(2, 12, "c")
    assert owner.emitted == [] and sorted(attempt.pending) == [1, 2]
    attempt.deliver(0, 10, "a")
    assert [t.token_id for t in owner.emitted] == [10, 11, 12] and not attempt.pending
