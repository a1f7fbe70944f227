"""The load generator's node core, sans I/O, on a fake clock: plans, steps, batch sizes,
max_tokens and the FINAL, `full`, bad bodies, cancel, late steps, and the stamps."""

from __future__ import annotations

import pytest

from harness.loadgen.core import (
    PLAIN_TEXT,
    STAMP_FIELD,
    Admitted,
    LoadGenCore,
    Refusal,
    Stamp,
    format_stamp,
    read_stamps,
    token_id,
)
from nodes import wire

STEP = 0.02


def request(max_tokens: int = 3, prompt: tuple[int, ...] = (1, 2, 3)) -> dict:
    return wire.to_wire(wire.DecodeRequestBody(prompt, wire.SamplingParams(max_tokens=max_tokens)))


@pytest.fixture
def core(clock) -> LoadGenCore:
    return LoadGenCore("lg-0", STEP, max_batch=2, next_step_at=clock.now)


def test_a_request_gets_a_local_plan_the_real_client_reads(core, clock):
    answer = core.admit("r1", request(), clock.now)
    assert isinstance(answer, Admitted)
    plan = wire.from_wire(wire.PlanBody, answer.plan)
    assert plan == wire.PlanBody.local("lg-0") and core.num_running == 1


def test_no_step_before_it_is_due_then_one_token_per_running_stream(core, clock):
    core.admit("r1", request(), clock.now)
    core.admit("r2", request(), clock.now)
    first = core.step(clock.now)
    assert first is not None and [rid for rid, _ in first.tokens] == ["r1", "r2"]
    assert core.step(clock.advance(STEP / 2)) is None
    second = core.step(clock.advance(STEP / 2))
    assert second is not None and len(second.tokens) == 2
    tokens = [wire.read_partial(body, wire.Bounds()) for _, body in first.tokens + second.tokens]
    assert [t.index for t in tokens] == [0, 0, 1, 1]
    assert all(t.token_id == token_id(t.index, 512) and t.text == PLAIN_TEXT for t in tokens)


def test_a_stream_admitted_between_steps_starts_at_the_next(core, clock):
    core.admit("r1", request(), clock.now)
    core.step(clock.now)
    core.admit("r2", request(), clock.advance(0.005))
    step = core.step(clock.advance(STEP))
    indices = {rid: wire.read_partial(body, wire.Bounds()).index for rid, body in step.tokens}
    assert indices == {"r1": 1, "r2": 0}


def test_max_tokens_ends_the_stream_with_a_final_after_its_last_token(core, clock):
    core.admit("r1", request(max_tokens=2, prompt=(5, 6, 7, 8)), clock.now)
    assert core.step(clock.now).finals == []
    last = core.step(clock.advance(STEP))
    assert [rid for rid, _ in last.tokens] == ["r1"] and [rid for rid, _ in last.finals] == ["r1"]
    done = wire.from_wire(wire.DecodeDoneBody, last.finals[0][1], wire.Bounds(max_tokens=2))
    assert done.node_id == "lg-0" and done.finish_reason == "length" and done.plan == wire.PlanKind.LOCAL
    assert [t.index for t in done.tokens] == [0, 1] and done.usage == wire.Usage(4, 2)
    assert core.num_running == 0 and core.counters["finished"] == 1
    assert core.step(clock.advance(STEP)).tokens == []


def test_the_final_repeats_only_the_tokens_of_the_replay_window(clock):
    core = LoadGenCore("lg-0", STEP, 4, clock.now, final_window_s=2.5 * STEP)
    core.admit("r1", request(max_tokens=10), clock.now)
    for _ in range(9):
        core.step(clock.now)
        clock.advance(STEP)
    (_, body), = core.step(clock.now).finals
    done = wire.from_wire(wire.DecodeDoneBody, body, wire.Bounds(max_tokens=10))
    assert [t.index for t in done.tokens] == [7, 8, 9] and done.usage.completion_tokens == 10


def test_full_at_max_batch_then_room_again_when_a_stream_ends(core, clock):
    core.admit("r1", request(max_tokens=1), clock.now)
    core.admit("r2", request(), clock.now)
    refused = core.admit("r3", request(), clock.now)
    assert refused == Refusal(wire.Code.FULL, "2 streams running")
    core.step(clock.now)   # r1's only token and its FINAL
    assert isinstance(core.admit("r3", request(), clock.now), Admitted)
    assert core.counters["refused.full"] == 1


def test_a_body_that_does_not_parse_is_refused_with_the_wire_code(core, clock):
    for body in (None, {"prompt_token_ids": "x"}, {}):
        answer = core.admit("bad", body, clock.now)
        assert isinstance(answer, Refusal) and answer.code in (wire.Code.BAD_REQUEST, wire.Code.REJECTED)
    assert core.num_running == 0


def test_cancel_stops_the_stream_and_is_idempotent(core, clock):
    core.admit("r1", request(max_tokens=5), clock.now)
    core.admit("r2", request(max_tokens=5), clock.now)
    core.step(clock.now)
    assert core.cancel("r1") and not core.cancel("r1") and not core.cancel("never")
    step = core.step(clock.advance(STEP))
    assert [rid for rid, _ in step.tokens] == ["r2"] and step.finals == []


def test_a_starved_node_steps_once_and_counts_it_late(core, clock):
    core.admit("r1", request(max_tokens=50), clock.now)
    core.step(clock.now)
    step = core.step(clock.advance(5 * STEP))
    assert len(step.tokens) == 1 and core.counters["steps.late"] == 1
    assert core.next_step_at == pytest.approx(clock.now + STEP)
    assert core.step(clock.now) is None


def test_steps_keep_their_cadence_when_a_little_late(core, clock):
    core.step(clock.now)
    core.step(clock.advance(STEP * 1.5))
    assert core.next_step_at == pytest.approx(clock.now + STEP / 2) and core.counters["steps.late"] == 0


def test_field_stamp_rides_beside_a_token_the_client_still_reads(clock):
    core = LoadGenCore("lg-0", STEP, 4, clock.now, Stamp.FIELD)
    core.admit("r1", request(), clock.now)
    (_, body), = core.step(clock.now).tokens
    assert body[STAMP_FIELD] == clock.now
    assert wire.read_partial(body, wire.Bounds()) == wire.TokenBody(0, token_id(0, 512), PLAIN_TEXT)


def test_text_stamp_survives_as_the_text(clock):
    core = LoadGenCore("lg-0", STEP, 4, clock.now, Stamp.TEXT)
    core.admit("r1", request(), clock.now)
    (_, body), = core.step(clock.now).tokens
    assert body["text"] == format_stamp(clock.now) and STAMP_FIELD not in body
    assert read_stamps("data " + body["text"] + body["text"]) == [pytest.approx(clock.now)] * 2


def test_counters_add_up(core, clock):
    for rid in ("r1", "r2"):
        core.admit(rid, request(max_tokens=2), clock.now)
    for _ in range(3):
        core.step(clock.now)
        clock.advance(STEP)
    counts = core.counters
    assert (counts["steps"], counts["tokens"], counts["finished"], counts["max_batch_seen"]) == (3, 4, 2, 2)
