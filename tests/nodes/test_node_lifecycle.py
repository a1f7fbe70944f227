"""Lifecycle (nodes/node_lifecycle.py) with a fake clock: drains to leave, drains to switch role,
deadlines and hand-overs, refusals, SIGTERM twice, the capacity keys."""

from __future__ import annotations

from nodes import wire
from nodes.node_lifecycle import Action, Lifecycle, Phase

DRAIN = wire.ControlBody("drain")


def to(role: str) -> wire.ControlBody:
    return wire.ControlBody("role", role)


def test_a_serving_node_takes_its_role_s_services_and_does_nothing_else():
    life = Lifecycle("decode")
    assert life.accepts("decode") and not life.accepts("prefill")
    assert life.next_action(0.0, 3) is Action.NONE and life.capacity() == {}


def test_a_drain_refuses_new_work_waits_for_running_work_then_exits():
    life = Lifecycle("decode", drain_timeout_s=10.0)
    assert life.on_control(DRAIN, 0.0) is None
    assert not life.accepts("decode") and life.capacity() == {"draining": 1}
    assert life.next_action(5.0, 2) is Action.NONE   # running streams finish on their own
    assert life.next_action(6.0, 0) is Action.EXIT


def test_past_the_deadline_what_still_runs_is_handed_over():
    life = Lifecycle("prefill", drain_timeout_s=10.0)
    life.on_control(DRAIN, 0.0)
    assert life.next_action(9.99, 1) is Action.NONE
    assert life.next_action(10.0, 1) is Action.HAND_OVER
    assert life.next_action(10.0, 0) is Action.EXIT


def test_a_switch_drains_the_old_role_then_serves_the_new_one():
    life = Lifecycle("decode", switchable=True, drain_timeout_s=10.0)
    assert life.capacity() == {"switchable": 1, "role_switches": 0}
    assert life.on_control(to("prefill"), 0.0) is None
    assert life.phase is Phase.SWITCHING and not life.accepts("decode") and not life.accepts("prefill")
    assert life.next_action(1.0, 1) is Action.NONE
    assert life.next_action(2.0, 0) is Action.SWITCH
    assert life.role == "prefill" and life.accepts("prefill") and not life.accepts("decode")
    assert life.capacity() == {"switchable": 1, "role_switches": 1}
    assert life.next_action(3.0, 0) is Action.NONE and life.deadline is None


def test_switches_that_make_no_sense_are_refused_with_a_reason():
    assert "switchable" in Lifecycle("decode").on_control(to("prefill"), 0.0)
    life = Lifecycle("decode", switchable=True)
    assert "already serves" in life.on_control(to("decode"), 0.0)
    life.on_control(DRAIN, 0.0)
    assert "draining to leave" in life.on_control(to("prefill"), 1.0)


def test_a_switch_back_while_switching_calls_it_off():
    life = Lifecycle("decode", switchable=True)
    life.on_control(to("prefill"), 0.0)
    assert life.on_control(to("decode"), 1.0) is None
    assert life.phase is Phase.SERVING and life.accepts("decode") and life.next_action(2.0, 0) is Action.NONE


def test_a_drain_overrides_a_switch_and_keeps_its_deadline():
    life = Lifecycle("decode", switchable=True, drain_timeout_s=10.0)
    life.on_control(to("prefill"), 0.0)
    life.on_control(DRAIN, 5.0)
    assert life.deadline == 10.0 and life.next_action(10.0, 1) is Action.HAND_OVER
    assert life.next_action(10.0, 0) is Action.EXIT


def test_sigterm_drains_and_a_second_one_stops_at_once():
    life = Lifecycle("decode")
    assert life.on_terminate(0.0) is False and life.draining
    assert life.on_terminate(1.0) is True
