"""A decode job's lifecycle (nodes/decode_jobs.py): every (state, event) pair either moves along the
table or raises `JobError`, so a job that is finished, failed or cancelled never streams, never takes
KV and never ends twice; only a waiting job takes KV or a kv_ready."""

from __future__ import annotations

import itertools

import pytest

from bus.kv import TransferResult
from nodes import wire
from nodes.decode_jobs import TRANSITIONS, DecodeJob, JobError, JobEvent, JobState, KvReadyRefusal, next_state

S, E = JobState, JobEvent
LEGAL = [
    (S.NEW, E.RESERVE, S.WAITING), (S.NEW, E.START, S.RUNNING), (S.NEW, E.FAIL, S.FAILED),
    (S.WAITING, E.KV_ARRIVED, S.WAITING), (S.WAITING, E.KV_READY, S.WAITING),
    (S.WAITING, E.TRANSFER_FAILED, S.WAITING), (S.WAITING, E.START, S.RUNNING), (S.WAITING, E.FAIL, S.FAILED),
    (S.WAITING, E.CANCEL, S.CANCELLED),
    (S.RUNNING, E.FINISH, S.FINISHED), (S.RUNNING, E.FAIL, S.FAILED), (S.RUNNING, E.CANCEL, S.CANCELLED),
]
ILLEGAL = [(state, event) for state, event in itertools.product(JobState, JobEvent)
           if (state, event) not in {(s, e) for s, e, _ in LEGAL}]
ENDED = (S.FINISHED, S.FAILED, S.CANCELLED)


@pytest.mark.parametrize(("state", "event", "expected"), LEGAL)
def test_a_legal_move(state, event, expected):
    assert next_state(state, event) is expected


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_an_illegal_move_raises(state, event):
    with pytest.raises(JobError, match=event.name):
        next_state(state, event)


def test_the_table_is_exactly_the_legal_moves_and_an_ended_job_moves_no_more():
    assert {(s, e): after for s, e, after in LEGAL} == TRANSITIONS
    assert not [key for key in TRANSITIONS if key[0] in ENDED]


def job() -> DecodeJob:
    return DecodeJob("r1", (1, 2, 3), wire.SamplingParams(), None, wire.PlanKind.REMOTE)


def test_a_remote_job_waits_for_both_halves_of_one_transfer():
    j = job()
    j.reserve(4, expires_at=9.0)
    j.transfer_ids |= {"t1", "t2"}
    assert j.waiting and j.num_blocks == 4 and j.ready_transfer_id() is None
    j.accept_kv_ready("t1", "prefill-0", 7)
    j.kv_arrived(TransferResult("t2", "r1", True, None, 0, "", None))   # the other transfer's KV: no match
    assert j.ready_transfer_id() is None
    j.transfer_failed("t1")   # its kv_ready no longer binds the request
    assert j.ready_peer is None and j.kv_ready == {}
    j.accept_kv_ready("t2", "prefill-1", 8)
    assert j.ready_transfer_id() == "t2"
    j.start()
    assert j.running and j.num_blocks == 0 and j.kv_ready_refusal("t2", "prefill-1") is KvReadyRefusal.UNKNOWN_REQUEST


def test_a_finished_job_takes_nothing_more():
    j = job()
    j.start()
    j.finish()
    for move in (j.finish, j.fail, j.cancel, j.start, lambda: j.accept_kv_ready("t", "p", 1)):
        with pytest.raises(JobError):
            move()
    assert j.state is S.FINISHED


def test_who_may_say_kv_ready():
    j = job()
    assert j.kv_ready_refusal("t1", "p") is KvReadyRefusal.UNKNOWN_REQUEST   # not admitted yet
    j.reserve(1, 0.0)
    j.transfer_ids.add("t1")
    assert j.kv_ready_refusal("made-up", "p") is KvReadyRefusal.UNKNOWN_TRANSFER
    j.accept_kv_ready("t1", "p", 1)
    assert j.kv_ready_refusal("t1", "q") is KvReadyRefusal.WRONG_PEER and j.kv_ready_refusal("t1", "p") is None


@pytest.mark.parametrize(("local", "num_session", "held", "short", "plan", "cached"), [
    (False, 40, 0, 64, "cached", 40),      # a short follow-up turn on the session's KV
    (False, 40, 32, 0, "remote", 32),      # busy (short 0): the rest goes to a prefill node
    (False, 0, 32, 64, "cached", 32),      # a held prefix leaves a short rest
    (False, 0, 0, 64, "remote", 0),        # nothing held
    (True, 40, 32, 64, "local", 32),       # colocated or asked: local, on top of what is held
])
def test_plan_job_picks_the_plan_and_holds_only_when_the_session_does_not_serve(local, num_session, held, short,
                                                                                plan, cached):
    from nodes.decode_jobs import DecodeJob, plan_job
    from nodes.engines.base import SamplingParams

    job = DecodeJob("r", tuple(range(3, 50)), SamplingParams(), "s", wire.PlanKind.REMOTE)
    holds = []
    plan_job(job, local=local, num_session=num_session, short=short, hold=lambda: holds.append(1) or held)
    assert (job.plan, job.num_cached_tokens) == (plan, cached)
    served_by_session = plan == "cached" and cached == num_session > 0
    assert holds == ([] if served_by_session else [1])
