"""BrokerCore with a fake clock: registration, heartbeats and expiry, stream routing, node and
client loss, re-registration after a broker restart, malformed input, metrics."""

from __future__ import annotations

import pytest

from bus import codec
from bus import constants as c
from bus.broker_core import BrokerCore
from bus.broker_tables import CapacityChanged, NodeJoined, NodeLeft
from bus.constants import Command
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
    Request,
)
from bus.routing import Refuse
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
W, G, W2, P = b"worker", b"gateway", b"worker2", b"prefill"


@pytest.fixture
def broker(clock):
    return BrokerDriver(BrokerCore(HB), clock)


@pytest.fixture
def pair(broker):
    broker.register(W, "decode", "d1", capacity={"kv_blocks_free": 10})
    broker.register(G, "gateway", "g1")
    broker.outgoing()
    broker.core.take_events()
    return broker


def test_ready_registers_and_is_acknowledged(broker):
    broker.register(W, "decode", "d1", capacity={"kv_blocks_total": 64}, data_endpoint="tcp://x:1")
    assert broker.to(W) == [Heartbeat()]
    node = broker.core.nodes_by_id["d1"]
    assert (node.role, node.capacity, node.data_endpoint) == ("decode", {"kv_blocks_total": 64}, "tcp://x:1")
    assert broker.core.take_events() == [NodeJoined("d1", "decode", {"kv_blocks_total": 64}, "tcp://x:1", 0)]
    assert broker.core.metrics["nodes.joined"] == 1


def test_an_idle_node_expires_after_the_idle_window(pair):
    pair.keep_alive(2.99, G)   # the gateway keeps the short window: it must heartbeat every 0.25 s
    assert "d1" in pair.core.nodes_by_id
    pair.keep_alive(0.05, G)
    assert "d1" not in pair.core.nodes_by_id and "g1" in pair.core.nodes_by_id
    (left,) = [e for e in pair.core.take_events() if isinstance(e, NodeLeft)]
    assert left.reason == c.LeaveReason.EXPIRED and left.silent_for_s == pytest.approx(3.0, abs=0.06)
    assert pair.core.metrics["nodes.left.expired"] == 1


def test_a_node_with_work_expires_after_the_short_window_from_when_the_work_began(pair):
    pair.keep_alive(0.9, G)   # idle: 0.9 s of silence is fine
    pair.send(G, Request("decode", "r1"))
    pair.keep_alive(0.7, G, step=0.05)   # the short window counts from the request, not the silence
    assert "d1" in pair.core.nodes_by_id
    pair.keep_alive(0.15, G, step=0.05)
    assert "d1" not in pair.core.nodes_by_id
    (left,) = [e for e in pair.core.take_events() if isinstance(e, NodeLeft)]
    assert left.reason == c.LeaveReason.EXPIRED and left.lost_request_ids == ("r1",)
    assert [(m.request_id, m.code) for m in pair.to(G) if isinstance(m, Error)] == [("r1", c.ErrorCode.NODE_LOST)]


def test_a_gateway_is_judged_by_the_short_window(pair):
    pair.keep_alive(0.76, W)
    assert "g1" not in pair.core.nodes_by_id and "d1" in pair.core.nodes_by_id


def test_a_closed_connection_makes_the_broker_probe_every_node_for_one_interval(pair):
    pair.core.on_connection_closed(pair.clock.now)
    assert {dest for dest, m in pair.outgoing() if m == Heartbeat()} == {W, G}
    pair.tick(0.05)
    assert {dest for dest, m in pair.outgoing() if m == Heartbeat()} == {W, G}   # the pipe may close late
    pair.tick(0.25)
    pair.outgoing()
    pair.tick(0.05)
    assert pair.outgoing() == []   # probing over: heartbeats only on idle links again


def test_closes_during_a_probe_extend_it_without_a_burst_to_every_node(pair):
    pair.core.on_connection_closed(pair.clock.now)
    pair.outgoing()
    pair.clock.advance(0.2)
    pair.core.on_connection_closed(pair.clock.now)   # churn: another close while probing
    assert pair.outgoing() == []                     # the ticks probe; no second burst
    pair.tick(0.2)                                   # past the first probe's end: still probing
    assert {dest for dest, m in pair.outgoing() if m == Heartbeat()} == {W, G}


def test_a_node_whose_connection_is_gone_leaves_one_interval_later(pair):
    pair.send(G, Request("decode", "r1", {}, (), "k"))
    pair.outgoing()
    pair.core.peer_gone(W, pair.clock.now)
    pair.core.peer_gone(W, pair.clock.now + 0.1)   # later failed sends do not push the deadline
    pair.core.peer_gone(b"stranger", pair.clock.now)   # unknown identities are ignored
    pair.tick(0.24)
    pair.send(G, Heartbeat())
    assert "d1" in pair.core.nodes_by_id
    pair.tick(0.02)
    (left,) = [e for e in pair.core.take_events() if isinstance(e, NodeLeft)]
    assert left.reason == c.LeaveReason.CONNECTION_LOST and left.lost_request_ids == ("r1",)
    assert left.silent_for_s < HB.expiry_s
    assert [(m.request_id, m.code) for m in pair.to(G) if isinstance(m, Error)] == [("r1", c.ErrorCode.NODE_LOST)]
    assert pair.core.metrics["nodes.left.connection_lost"] == 1


def test_a_node_that_reconnects_within_the_interval_keeps_its_requests(pair):
    pair.send(G, Request("decode", "r1", {}, (), "k"))
    pair.outgoing()
    pair.core.peer_gone(W, pair.clock.now)
    pair.tick(0.1)
    pair.register(W2, "decode", "d1", inflight=("r1",))   # libzmq reconnected: a new routing id
    pair.tick(0.3)
    assert [e.reason for e in pair.core.take_events() if isinstance(e, NodeLeft)] == [c.LeaveReason.REPLACED]
    assert not [m for m in pair.to(G) if isinstance(m, Error)]
    pair.send(W2, Final("r1", 0))
    assert [m.request_id for m in pair.to(G)] == ["r1"]


def test_any_traffic_counts_as_life(pair):
    for _ in range(10):
        pair.tick(0.5)
        pair.send(W, CapacityUpdate({"kv_blocks_free": 3}))
        pair.send(G, Heartbeat())
    assert {"d1", "g1"} <= set(pair.core.nodes_by_id)


def test_heartbeats_only_on_idle_links(pair):
    pair.tick(0.1)
    assert pair.outgoing() == []
    pair.tick(0.15)
    assert [dest for dest, m in pair.outgoing() if m == Heartbeat()] == [G]   # d1 has no work: 1 s
    pair.send(G, Request("decode", "r1"))   # traffic to W resets its idle timer; it has work now
    pair.tick(0.2)
    sent = pair.outgoing()
    assert (W, Heartbeat()) not in sent and (G, Heartbeat()) not in sent
    pair.tick(0.05)
    assert (W, Heartbeat()) in pair.outgoing()


def test_an_idle_node_is_heartbeaten_at_the_idle_interval(pair):
    for _ in range(3):
        pair.send(W, Heartbeat())
        pair.tick(0.95)
        assert (W, Heartbeat()) not in pair.outgoing()
        pair.tick(0.05)
        assert (W, Heartbeat()) in pair.outgoing()
        pair.send(G, Heartbeat())


def test_request_streams_partials_then_final_to_the_client(pair):
    pair.send(G, Request("decode", "r1", {"p": 1}, (b"raw",), key="s1"))
    (request,) = pair.to(W)
    assert (request.request_id, request.peer, request.key, request.body) == ("r1", "g1", "s1", {"p": 1})
    for seq in range(3):
        pair.send(W, Partial("r1", seq, {"t": seq}))
    pair.send(W, Final("r1", 3, {"done": True}))
    replies = pair.to(G)
    assert [r.seq for r in replies] == [0, 1, 2, 3] and isinstance(replies[-1], Final)
    assert pair.core.routes == {} and pair.core.nodes_by_id["d1"].serving == set()
    assert pair.core.metrics["routed.reply"] == 4 and pair.core.metrics["routed.request"] == 1


def test_forwarded_frames_are_the_received_objects(pair):
    pair.send(G, Request("decode", "r1"))
    pair.outgoing()
    frames = codec.encode(Partial("r1", 0, {"t": 1}, (memoryview(b"payload"),)))
    pair.send_raw(W, frames)
    (out,) = pair.core.take_outbox()
    assert out[0] == G and all(a is b for a, b in zip(out[1:], frames, strict=True))


def test_no_node_for_service_is_a_request_error(pair):
    pair.send(G, Request("prefill", "r1"))
    assert pair.to(G) == [Error("r1", c.ErrorCode.NO_NODE, "no live node serves 'prefill'")]


def test_duplicate_request_id_is_refused(pair):
    pair.send(G, Request("decode", "r1"))
    pair.send(G, Request("decode", "r1"))
    assert [m.code for m in pair.to(G)] == [c.ErrorCode.DUPLICATE_REQUEST]


def test_default_policy_picks_the_least_loaded_node_and_both_serves_decode(pair):
    pair.register(W2, "both", "b1")
    pair.outgoing()
    for i in range(4):
        pair.send(G, Request("decode", f"r{i}"))
    counts = {dest: 0 for dest in (W, W2)}
    for dest, _ in pair.outgoing():
        counts[dest] += 1
    assert counts == {W: 2, W2: 2}


def test_a_custom_policy_chooses(clock):
    class Last:
        def __init__(self):
            self.seen = []

        def on_join(self, node):
            self.seen.append(("join", node.node_id))

        def on_leave(self, node, reason):
            self.seen.append(("leave", node.node_id, reason))

        def on_capacity(self, node):
            self.seen.append(("capacity", node.node_id, dict(node.capacity)))

        def choose(self, service, key, request_id, candidates):
            self.seen.append(("choose", service, key, request_id))
            return candidates[-1]

    policy = Last()
    broker = BrokerDriver(BrokerCore(HB, policy), clock)
    broker.register(W, "decode", "d1")
    broker.register(W2, "decode", "d2")
    broker.register(G, "gateway", "g1")
    broker.send(W, CapacityUpdate({"kv_blocks_free": 1}))
    broker.outgoing()
    broker.send(G, Request("decode", "r1", key="session"))
    assert [dest for dest, _ in broker.outgoing()] == [W2]
    broker.send(W, Disconnect("shutdown"))
    assert policy.seen == [("join", "d1"), ("join", "d2"), ("join", "g1"),
                           ("capacity", "d1", {"kv_blocks_free": 1}),
                           ("choose", "decode", "session", "r1"), ("leave", "d1", "disconnected")]


def test_a_policy_can_refuse_with_its_own_error(clock):
    class Full:
        def on_join(self, node): pass
        def on_leave(self, node, reason): pass
        def on_capacity(self, node): pass

        def choose(self, service, key, request_id, candidates):
            raise Refuse("overloaded", "all decode nodes are full", retry_after_s=0.5)

    broker = BrokerDriver(BrokerCore(HB, Full()), clock)
    broker.register(W, "decode", "d1")
    broker.register(G, "gateway", "g1")
    broker.outgoing()
    broker.send(G, Request("decode", "r1"))
    assert broker.to(G) == [Error("r1", "overloaded", "all decode nodes are full", {"retry_after_s": 0.5})]
    assert broker.core.routes == {} and broker.core.metrics["rejected.overloaded"] == 1


def test_ready_again_on_the_same_socket_is_a_leave_then_a_join(pair):
    pair.send(G, Request("decode", "r1"))
    pair.send(G, Request("decode", "r2"))
    pair.outgoing()
    pair.core.take_events()
    pair.register(W, "decode", "d1", inflight=("r2",))
    assert [type(e).__name__ for e in pair.core.take_events()] == ["NodeLeft", "NodeJoined"]
    assert [(m.request_id, m.code) for m in pair.to(G) if isinstance(m, Error)] == [("r1", "node_lost")]
    assert pair.core.nodes_by_id["d1"].serving == {b"r2"}


def test_dead_server_fails_its_requests_with_node_lost(pair):
    pair.send(G, Request("decode", "r1"))
    pair.send(W, Partial("r1", 0))
    pair.outgoing()
    pair.tick(0.5)
    pair.send(G, Heartbeat())
    pair.tick(0.5)
    errors = [m for m in pair.to(G) if isinstance(m, Error)]
    assert errors == [Error("r1", c.ErrorCode.NODE_LOST, "node d1 left", {"node_id": "d1", "num_replies": 1})]
    (left,) = [e for e in pair.core.take_events() if isinstance(e, NodeLeft)]
    assert left.lost_request_ids == ("r1",)


def test_dead_client_cancels_its_requests_on_the_server(pair):
    pair.send(G, Request("decode", "r1"))
    pair.outgoing()
    pair.send(G, Disconnect("shutdown"))
    assert pair.to(W) == [Cancel("r1", c.CancelReason.CLIENT_LOST)]
    assert pair.core.nodes_by_id["d1"].serving == set()


def test_client_cancel_reaches_the_server_and_ends_the_route(pair):
    pair.send(G, Request("decode", "r1"))
    pair.outgoing()
    pair.send(G, Cancel("r1", "client"))
    assert pair.to(W) == [Cancel("r1", "client")]
    pair.send(W, Partial("r1", 0))
    assert pair.outgoing() == [] and pair.core.metrics["dropped.unknown_request"] == 1


def test_only_the_serving_node_may_reply(pair):
    pair.register(W2, "decode", "d2")
    pair.send(G, Request("decode", "r1"))
    (dest, _), *_ = [(d, m) for d, m in pair.outgoing() if isinstance(m, Request)]
    other = W2 if dest == W else W
    pair.send(other, Final("r1", 0))
    assert pair.outgoing() == [] and b"r1" in pair.core.routes


def test_direct_messages_carry_the_sender(pair):
    pair.register(P, "prefill", "p1")
    pair.outgoing()
    pair.send(P, Direct("d1", {"kv": "ready"}, (b"blob",)))
    (message,) = pair.to(W)
    assert (message.peer, message.body, bytes(message.payload[0])) == ("p1", {"kv": "ready"}, b"blob")
    pair.send(P, Direct("nobody", None))
    assert pair.to(P) == []                                   # held: "nobody" may be re-registering
    pair.tick(pair.core.orphan_grace_s + 0.01)
    assert [m.code for m in pair.to(P) if isinstance(m, Error)] == [c.ErrorCode.UNKNOWN_NODE]


def test_directs_pass_only_between_serving_nodes(pair):
    """A gateway key can neither send a DIRECT (a forged kv_ready) nor receive one."""
    pair.send(G, Direct("d1", {"type": "kv_ready"}))
    assert pair.to(W) == []
    pair.register(P, "prefill", "p1")
    pair.outgoing()
    pair.send(P, Direct("g1", {"type": "kv_ready"}))
    assert [m.code for m in pair.to(P) if isinstance(m, Error)] == [c.ErrorCode.FORBIDDEN]
    assert pair.core.metrics["rejected.forbidden_direct"] == 2


def test_a_direct_for_a_node_not_back_yet_is_delivered_when_it_registers(pair):
    """After a broker restart a prefill node may resend its kv_ready before the decode node is back."""
    pair.register(P, "prefill", "p1")
    pair.send(P, Direct("d9", {"type": "kv_ready"}))
    pair.tick(0.5)
    pair.register(b"W9", "decode", "d9")
    (message,) = [m for m in pair.to(b"W9") if isinstance(m, Direct)]
    assert (message.peer, message.body) == ("p1", {"type": "kv_ready"})
    pair.tick(pair.core.orphan_grace_s)
    assert [m for m in pair.to(P) if isinstance(m, Error)] == []   # delivered: no unknown_node later


def test_capacity_update_replaces_capacity(pair):
    pair.send(W, CapacityUpdate({"kv_blocks_free": 2}))
    assert pair.core.nodes_by_id["d1"].capacity == {"kv_blocks_free": 2}
    assert pair.core.take_events() == [CapacityChanged("d1", {"kv_blocks_free": 2})]


def test_same_node_id_from_a_new_socket_replaces_and_keeps_announced_requests(pair):
    pair.send(G, Request("decode", "r1"))
    pair.send(G, Request("decode", "r2"))
    pair.outgoing()
    pair.register(W2, "decode", "d1", inflight=("r1",))
    assert pair.core.nodes_by_id["d1"].identity == W2
    assert [e.reason for e in pair.core.take_events() if isinstance(e, NodeLeft)] == [c.LeaveReason.REPLACED]
    assert [(m.request_id, m.code) for m in pair.to(G)] == [("r2", c.ErrorCode.NODE_LOST)]
    pair.send(W2, Final("r1", 0))
    assert [m.request_id for m in pair.to(G)] == ["r1"]


def test_restarted_broker_rebuilds_routes_from_ready(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(W, "decode", "d1", inflight=("r1", "r9"))
    broker.register(G, "gateway", "g1", pending=("r1",))
    broker.outgoing()
    broker.send(W, Partial("r1", 5))
    assert [(m.request_id, m.seq) for m in broker.to(G)] == [("r1", 5)]
    broker.keep_alive(1.6, W, G)   # r9 never claimed by a client: the server is told to stop
    assert Cancel("r9", c.CancelReason.CLIENT_LOST) in broker.to(W)
    assert set(broker.core.routes) == {b"r1"} and broker.core.metrics["failed.request_lost"] == 1


def test_replies_before_the_client_reregistered_are_held_then_forwarded_in_order(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(W, "decode", "d1", inflight=("r1",))   # the server is back first
    broker.outgoing()
    broker.send(W, Partial("r1", 5))
    broker.send(W, Partial("r1", 6))
    broker.send(W, Final("r1", 7))
    assert broker.outgoing() == [] and broker.core.metrics["held.reply"] == 3
    broker.register(G, "gateway", "g1", pending=("r1",))
    assert [(type(m).__name__, m.seq) for m in broker.to(G) if not isinstance(m, Heartbeat)] == [
        ("Partial", 5), ("Partial", 6), ("Final", 7)]
    assert not broker.core.routes and not broker.core.orphans   # the held FINAL ended the route


def test_a_replayed_final_nobody_claims_expires_without_counting_a_lost_request(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(W, "decode", "d1", inflight=("r1",))   # replayed: its client already had it
    broker.send(W, Final("r1", 3))
    broker.keep_alive(1.6, W)
    assert not broker.core.routes and broker.core.metrics["dropped.unclaimed_reply"] == 1
    assert broker.core.metrics["failed.request_lost"] == 0


def test_orphaned_pending_request_fails_with_request_lost(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(G, "gateway", "g1", pending=("r1",))
    broker.outgoing()
    broker.keep_alive(1.6, G)
    assert [m.code for m in broker.to(G) if isinstance(m, Error)] == [c.ErrorCode.REQUEST_LOST]


# -- bad input --------------------------------------------------------------------------

def test_unregistered_peer_gets_disconnect_not_registered(broker):
    broker.send(W, Heartbeat())
    assert broker.to(W) == [Disconnect(c.DisconnectReason.NOT_REGISTERED, "send READY first")]
    assert broker.core.metrics["dropped.not_registered"] == 1


def test_wrong_version_is_dropped_counted_and_disconnected(pair):
    pair.send_raw(W, [b"PDB" + bytes((c.VERSION + 1, Command.HEARTBEAT))])
    assert [m.reason for m in pair.to(W)] == [c.DisconnectReason.BAD_VERSION]
    assert "d1" not in pair.core.nodes_by_id and "g1" in pair.core.nodes_by_id
    assert pair.core.metrics["dropped.bad_version"] == 1


@pytest.mark.parametrize("frames", [
    [], [b""], [b"garbage"], [codec.HEADERS[Command.READY]], [codec.HEADERS[Command.READY], b"\xc1"],
    [codec.HEADERS[Command.HEARTBEAT], b"extra"], [codec.HEADERS[Command.REQUEST], b"decode"],
])
def test_malformed_input_from_a_stranger_is_dropped(pair, frames):
    pair.send_raw(b"stranger", frames)
    assert [type(m) for m in pair.to(b"stranger")] == [Disconnect]
    assert pair.core.metrics["dropped.malformed"] == 1
    pair.send(G, Request("decode", "r1"))
    assert [type(m) for m in pair.to(W)] == [Request]   # everyone else is still served


def test_oversized_request_gets_a_request_error(clock):
    broker = BrokerDriver(BrokerCore(HB, max_message_bytes=1000), clock)
    broker.register(W, "decode", "d1")
    broker.register(G, "gateway", "g1")
    broker.outgoing()
    broker.send(G, Request("decode", "big", None, (b"x" * 2000,)))
    assert [(m.request_id, m.code) for m in broker.to(G)] == [("big", c.ErrorCode.OVERSIZED)]
    assert broker.core.metrics["dropped.oversized"] == 1 and "g1" in broker.core.nodes_by_id


def test_oversized_reply_ends_the_stream_for_both_ends(clock):
    broker = BrokerDriver(BrokerCore(HB, max_message_bytes=1000), clock)
    broker.register(W, "decode", "d1")
    broker.register(G, "gateway", "g1")
    broker.send(G, Request("decode", "r1"))
    broker.outgoing()
    broker.send(W, Partial("r1", 0, None, (b"x" * 2000,)))
    sent = broker.outgoing()
    assert {(dest, m.code) for dest, m in sent} == {(W, "oversized"), (G, "oversized")}
    assert broker.core.routes == {}


def test_malformed_request_id_is_refused_without_disconnect(pair):
    pair.send_raw(G, [codec.HEADERS[Command.REQUEST], b"decode", b"", b"", b"", codec.pack(None)])
    assert [m.code for m in pair.to(G)] == [c.ErrorCode.MALFORMED] and "g1" in pair.core.nodes_by_id


def test_shutdown_disconnects_everyone(pair):
    pair.core.shutdown(pair.clock.now)
    assert {(dest, m.reason) for dest, m in pair.outgoing()} == {(W, "shutdown"), (G, "shutdown")}
