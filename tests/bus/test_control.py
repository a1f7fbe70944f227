"""CONTROL (0x0D) and role changes: a `control` peer commands a serving node through the broker,
nobody else may, bodies are bounded and checked; a node re-registers in another role on its link
(PROTOCOL.md §1.3 items 6a and 10)."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import codec
from bus import constants as c
from bus.broker_core import BrokerCore
from bus.constants import Command
from bus.endpoint_core import EndpointCore
from bus.endpoint_set import EndpointSet
from bus.liveness import HeartbeatConfig
from bus.messages import Control, Disconnect, Error, Final, Heartbeat, Ready, Request
from bus.send_checks import encode_checked
from bus.wire_checks import ProtocolError
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
CTL, DEC, PRE, GW = b"control", b"decode", b"prefill", b"gateway"


@pytest.fixture
def broker(clock):
    driver = BrokerDriver(BrokerCore(HB), clock)
    driver.register(CTL, "control", "planner")
    driver.register(DEC, "decode", "d1")
    driver.register(PRE, "prefill", "p1")
    driver.register(GW, "gateway", "g1")
    driver.outgoing()
    return driver


def _errors(broker, identity):
    return [m.code for m in broker.to(identity) if isinstance(m, Error)]


def test_codec_round_trip_and_bounds():
    frames = codec.encode(Control("d1", {"action": "drain"}))
    assert frames[0] == codec.HEADERS[Command.CONTROL]
    assert codec.decode(frames) == Control("d1", {"action": "drain"})
    with pytest.raises(ProtocolError):   # the sender learns at once, before anything travels
        encode_checked(Control("d1", {"pad": "x" * c.MAX_CONTROL_BYTES}))
    with pytest.raises(ProtocolError):
        codec.decode([frames[0], b"d1", msgpack.packb([1, 2])])   # not a map
    with pytest.raises(ProtocolError):
        codec.decode([frames[0], b"d1", msgpack.packb({"pad": "x" * c.MAX_CONTROL_BYTES})])
    with pytest.raises(ProtocolError):
        codec.decode([frames[0], b"d1", frames[2], b"payload"])   # CONTROL carries no payload


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_decoding_random_control_frames_raises_only_protocol_errors(peer, body):
    with contextlib.suppress(ProtocolError):
        codec.decode([codec.HEADERS[Command.CONTROL], peer, body])


def test_a_control_peer_commands_a_serving_node_which_sees_who_sent_it(broker):
    broker.send(CTL, Control("d1", {"action": "drain"}))
    (message,) = broker.to(DEC)
    assert message == Control("planner", {"action": "drain"})
    assert broker.core.metrics["routed.control"] == 1


@pytest.mark.parametrize("sender", [DEC, PRE, GW])
def test_no_one_but_a_control_peer_may_send_control(broker, sender):
    """A compromised node or gateway cannot drain or flip another node."""
    broker.send(sender, Control("d1", {"action": "drain"}))
    assert _errors(broker, sender) == [c.ErrorCode.FORBIDDEN]
    assert broker.to(DEC) == [] and broker.core.metrics["rejected.forbidden_control"] == 1


def test_control_reaches_only_serving_nodes_and_is_not_held(broker):
    broker.send(CTL, Control("g1", {"action": "drain"}))
    assert _errors(broker, CTL) == [c.ErrorCode.FORBIDDEN]
    broker.send(CTL, Control("nobody", {"action": "drain"}))
    assert _errors(broker, CTL) == [c.ErrorCode.UNKNOWN_NODE]
    broker.tick(broker.core.orphan_grace_s + 0.1)
    broker.register(b"late", "decode", "nobody")
    assert [m for m in broker.to(b"late") if isinstance(m, Control)] == []


def test_a_malformed_control_body_disconnects_its_sender(broker):
    broker.send_raw(CTL, [codec.HEADERS[Command.CONTROL], b"d1", b"\xc1"])
    assert [m for m in broker.to(CTL) if isinstance(m, Disconnect)]
    assert "planner" not in broker.core.nodes_by_id and "d1" in broker.core.nodes_by_id


def test_the_control_role_asks_but_serves_nothing(broker):
    assert broker.core.nodes_by_id["planner"].services == ()
    broker.send(CTL, Request(c.BROKER_STATS_SERVICE, "s1"))
    (stats,) = [m for m in broker.to(CTL) if isinstance(m, Final)]
    assert stats.body["role_by_node"] == {"d1": "decode", "p1": "prefill"}
    broker.send(CTL, Ready("control", "planner", inflight=("r1",)))   # a controller serves nothing
    assert [m for m in broker.to(CTL) if isinstance(m, Disconnect)]


def test_ready_again_in_another_role_moves_the_node_between_services(broker):
    broker.send(DEC, Ready("prefill", "d1"))
    assert broker.core.nodes_by_id["d1"].role == "prefill"
    assert [n.node_id for n in broker.core.by_service[b"prefill"]] == ["p1", "d1"]
    assert b"decode" not in broker.core.by_service
    broker.send(GW, Request("decode", "r1"))
    assert _errors(broker, GW) == [c.ErrorCode.NO_NODE]


def test_endpoint_core_delivers_control_to_a_serving_node_only(clock):
    node = EndpointCore("decode", "d1", heartbeat=HB)
    node.on_socket_opened(clock.now)
    node.on_frames(codec.encode(Heartbeat()), clock.now)
    node.on_frames(codec.encode(Control("planner", {"action": "drain"})), clock.now)
    assert Control("planner", {"action": "drain"}) in node.take_events()
    gateway = EndpointCore("gateway", "g1", heartbeat=HB)
    gateway.on_frames(codec.encode(Control("planner", {"action": "drain"})), clock.now)
    assert not any(isinstance(e, Control) for e in gateway.take_events())
    assert gateway.metrics["dropped.not_served"] == 1


def test_change_role_sends_ready_again_keeping_the_requests_in_flight(clock):
    endpoints = EndpointSet("decode", "d1", num_brokers=2, heartbeat=HB)
    for index in (0, 1):
        endpoints.on_socket_opened(index, clock.now)
        endpoints.on_frames(index, codec.encode(Heartbeat()), clock.now)
    endpoints.on_frames(0, codec.encode(Request("decode", "r1", peer="g1")), clock.now)
    endpoints.take_outbox()
    endpoints.change_role("prefill", clock.now)
    readies = [(i, codec.decode(f)) for i, f in endpoints.take_outbox()]
    assert sorted(i for i, _ in readies) == [0, 1]   # every broker learns the new role
    assert all(r.role == "prefill" for _, r in readies) and readies[0][1].inflight == ("r1",)
    with pytest.raises(ValueError):
        endpoints.change_role("king", clock.now)

