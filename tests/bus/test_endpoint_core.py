"""EndpointCore with a fake clock: registration, idle-only heartbeats, broker loss and
reconnect with back-off, re-registration with in-flight ids, reply sequence numbers and the
duplicate/gap checks on incoming streams, the backlog while unregistered."""

from __future__ import annotations

import random

import pytest

from bus import codec
from bus import constants as c
from bus.endpoint_core import EndpointCore, LinkDown, LinkUp
from bus.liveness import HeartbeatConfig
from bus.messages import (
    Cancel,
    CapacityUpdate,
    Direct,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Partial,
    Ready,
    Request,
)

HB = HeartbeatConfig(interval_s=0.25, liveness=3, backoff_cap_s=4.0)


def decoded(core: EndpointCore) -> list:
    return [codec.decode([bytes(f) for f in frames]) for frames in core.take_outbox()]


def receive(core: EndpointCore, message, now: float) -> None:
    core.on_frames(codec.encode(message), now)


@pytest.fixture
def node(clock):
    core = EndpointCore("decode", "d1", {"kv_blocks_free": 8}, "tcp://me:7", HB, random.Random(1))
    core.on_socket_opened(clock.now)
    return core


@pytest.fixture
def up(node, clock):
    node.take_outbox()
    receive(node, Heartbeat(), clock.now)
    node.take_events()
    return node


def test_opening_a_socket_sends_ready_with_capacity(node):
    assert decoded(node) == [Ready("decode", "d1", {"kv_blocks_free": 8}, "tcp://me:7")]
    assert not node.registered


def test_any_message_from_the_broker_completes_registration(node, clock):
    receive(node, Heartbeat(), clock.now)
    assert node.registered and node.take_events() == [LinkUp()]


def test_unknown_role_is_refused():
    with pytest.raises(ValueError):
        EndpointCore("chef", "x")


def test_heartbeat_only_when_idle(up, clock):
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)   # with work: the short interval
    clock.advance(0.2)
    up.update_capacity({"kv_blocks_free": 1}, clock.now)
    up.tick(clock.now)
    assert decoded(up) == [CapacityUpdate({"kv_blocks_free": 1})]
    clock.advance(0.2)
    receive(up, Heartbeat(), clock.now)
    assert not up.tick(clock.now) and decoded(up) == []
    clock.advance(0.06)
    up.tick(clock.now)
    assert decoded(up) == [Heartbeat()]


def test_a_node_without_work_heartbeats_at_the_idle_interval_and_waits_the_idle_window(up, clock):
    for _ in range(2):
        clock.advance(0.95)
        assert not up.tick(clock.now) and decoded(up) == []
        clock.advance(0.05)
        assert not up.tick(clock.now) and decoded(up) == [Heartbeat()]
    clock.advance(0.9)
    assert not up.tick(clock.now)
    clock.advance(0.15)
    assert up.tick(clock.now) is True   # nothing heard for over 3 s: the broker is lost
    assert [e for e in up.take_events() if isinstance(e, LinkDown)] == [LinkDown("expired")]


def test_timers_run_five_times_less_often_on_an_idle_link(node, up, clock):
    fresh = EndpointCore("decode", "d2", heartbeat=HB)
    fresh.on_socket_opened(clock.now)
    assert fresh.tick_interval() == HB.tick_s   # not registered yet: retries need the short tick
    assert up.tick_interval() == HB.idle_interval_s / 5
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)
    assert up.engaged and up.tick_interval() == HB.tick_s
    up.reply("r1", None, (), True, clock.now)   # its FINAL: idle again
    assert not up.engaged and up.tick_interval() == HB.idle_interval_s / 5


def test_a_gateway_keeps_the_short_interval_without_work(clock):
    gateway = EndpointCore("gateway", "g1", heartbeat=HeartbeatConfig(0.25, 3))
    gateway.on_socket_opened(clock.now)
    receive(gateway, Heartbeat(), clock.now)
    gateway.take_outbox()
    clock.advance(0.25)
    gateway.tick(clock.now)
    assert decoded(gateway) == [Heartbeat()]


def test_silent_broker_means_a_new_socket_and_ready_again(up, clock):
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)
    up.streams["mine"] = 0
    clock.advance(0.74)
    assert not up.tick(clock.now)
    clock.advance(0.02)
    assert up.tick(clock.now) is True
    assert [e for e in up.take_events() if isinstance(e, LinkDown)] == [LinkDown("expired")]
    up.take_outbox()
    up.on_socket_opened(clock.now)
    (ready,) = decoded(up)
    assert ready.inflight == ("r1",) and ready.pending == ("mine",)


def test_unanswered_ready_retries_with_growing_jittered_backoff(node, clock):
    waits = []
    for _ in range(6):
        opened = clock.now
        while not node.tick(clock.now):
            clock.advance(0.01)
        waits.append(clock.now - opened)
        node.on_socket_opened(clock.now)
    assert all(w >= HB.expiry_s - 0.011 for w in waits)        # each socket held a window
    assert waits[-1] > waits[0] and max(waits) <= HB.backoff_cap_s + 0.011


def test_disconnect_from_broker_triggers_prompt_reregistration(up, clock):
    receive(up, Disconnect(c.DisconnectReason.NOT_REGISTERED), clock.now)
    assert not up.registered and up.take_events() == [LinkDown("not_registered")]
    assert up.tick(clock.now)


def test_replies_the_old_broker_may_have_lost_go_out_again_after_reregistering(up, clock):
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)
    receive(up, Request("decode", "r2", None, (), "g1"), clock.now)
    up.reply("r2", {"t": 0}, (), True, clock.now)   # r2 done long before the broker went
    clock.advance(0.5)
    receive(up, Heartbeat(), clock.now)             # last heard from the old broker
    up.reply("r1", {"t": 0}, (), False, clock.now)
    clock.advance(0.1)
    up.reply("r1", {"t": 1}, (), True, clock.now)   # r1 finished while the broker was already dead
    up.take_outbox()
    receive(up, Disconnect(c.DisconnectReason.NOT_REGISTERED), clock.now)   # the new broker
    up.reply("r9", None, (), False, clock.now)      # not ours: nothing to replay
    assert up.tick(clock.now)
    up.on_socket_opened(clock.now)
    (ready,) = decoded(up)
    assert ready.inflight == ("r1",)                # finished, but its FINAL may be lost: routed again
    receive(up, Heartbeat(), clock.now)
    assert [(type(m).__name__, m.request_id, m.seq) for m in decoded(up)] == [("Partial", "r1", 0), ("Final", "r1", 1)]
    assert up.metrics["replies.replayed"] == 2 and not up.replay and not up.sent_replies


def test_a_direct_the_dying_broker_may_have_dropped_is_sent_again(up, clock):
    """A prefill node's kv_ready sent as the broker died: without it the decode node never starts."""
    receive(up, Heartbeat(), clock.now)             # last heard from the old broker
    up.direct(Direct("d2", {"type": "kv_ready"}), clock.now)
    up.take_outbox()
    clock.advance(0.1)
    receive(up, Disconnect(c.DisconnectReason.NOT_REGISTERED), clock.now)   # the new broker
    assert up.tick(clock.now)
    up.on_socket_opened(clock.now)
    (ready,) = decoded(up)
    assert ready.inflight == ()                     # a DIRECT names no request
    receive(up, Heartbeat(), clock.now)
    assert decoded(up) == [Direct("d2", {"type": "kv_ready"})]


def test_a_silent_broker_also_gets_the_recent_replies_again(up, clock):
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)
    up.reply("r1", {"t": 0}, (), False, clock.now)
    clock.advance(0.5)
    up.reply("r1", {"t": 1}, (), False, clock.now)
    clock.advance(0.8)
    assert up.tick(clock.now)                       # expired: last heard 1.3 s ago
    up.on_socket_opened(clock.now)
    up.take_outbox()
    up.reply("r1", {"t": 2}, (), False, clock.now)  # unregistered: the backlog keeps it
    receive(up, Heartbeat(), clock.now)
    assert [m.seq for m in decoded(up)] == [0, 1, 2]   # replay (sent since last heard - 1 interval), backlog


def test_repeated_refusals_back_off(node, clock):
    waits = []
    for _ in range(5):
        receive(node, Disconnect(c.DisconnectReason.BAD_VERSION), clock.now)
        opened = clock.now
        while not node.tick(clock.now):
            clock.advance(0.01)
        waits.append(clock.now - opened)
        node.on_socket_opened(clock.now)
    assert waits[0] < waits[-1] and waits[-1] > 0.5


def test_replies_are_numbered_per_request(up, clock):
    receive(up, Request("decode", "r1", None, (), "g1"), clock.now)
    assert up.take_events()[0].request_id == "r1"
    up.reply("r1", {"t": 1}, (), False, clock.now)
    up.reply("r1", {"t": 2}, (b"kv",), False, clock.now)
    up.reply("r1", None, (), True, clock.now)
    assert [(type(m).__name__, m.seq) for m in decoded(up)] == [("Partial", 0), ("Partial", 1), ("Final", 2)]
    assert not up.reply("r1", None, (), False, clock.now)   # finished: refused, counted
    assert up.metrics["dropped.reply_to_unknown_request"] == 1


def test_cancel_stops_a_request(up, clock):
    receive(up, Request("decode", "r1"), clock.now)
    receive(up, Cancel("r1", "client"), clock.now)
    assert [type(e) for e in up.take_events()] == [Request, Cancel]
    assert not up.reply_error("r1", "late", "", {}, clock.now)


def test_incoming_stream_drops_duplicates_and_counts_gaps(up, clock):
    up.request(Request("decode", "q1"), clock.now)
    for seq in (0, 1, 1, 0, 4):
        receive(up, Partial("q1", seq), clock.now)
    receive(up, Final("q1", 5), clock.now)
    assert [m.seq for m in up.take_events()] == [0, 1, 4, 5]
    assert up.metrics["dropped.duplicate"] == 2 and up.metrics["stream.gaps"] == 2
    assert "q1" not in up.streams


def test_error_ends_a_stream_and_unknown_replies_are_dropped(up, clock):
    up.request(Request("decode", "q1"), clock.now)
    receive(up, Error("q1", "node_lost", "gone"), clock.now)
    receive(up, Partial("q1", 0), clock.now)
    assert up.take_events() == [Error("q1", "node_lost", "gone")]
    assert up.metrics["dropped.unknown_request"] == 1


def test_unscoped_errors_and_directs_reach_node_code(up, clock):
    receive(up, Error("", "unknown_node", "no node 'x'"), clock.now)
    receive(up, Direct("g1", {"hi": 1}), clock.now)
    assert [type(e) for e in up.take_events()] == [Error, Direct]


def test_app_messages_wait_in_the_backlog_until_registered(node, clock):
    node.take_outbox()
    node.request(Request("decode", "q1"), clock.now)
    node.direct(Direct("d2", None), clock.now)
    assert decoded(node) == []
    receive(node, Heartbeat(), clock.now)
    assert [type(m) for m in decoded(node)] == [Request, Direct]


def test_malformed_input_is_counted_not_raised(up, clock):
    up.on_frames([b"junk"], clock.now)
    up.on_frames([b"PDB\x07\x02"], clock.now)
    assert up.metrics["dropped.malformed"] == 1 and up.metrics["dropped.bad_version"] == 1


def test_close_says_disconnect(up, clock):
    up.close(clock.now)
    assert decoded(up) == [Disconnect("shutdown", "node stopping")]
