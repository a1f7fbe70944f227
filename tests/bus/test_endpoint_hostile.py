"""Endpoints against odd input and odd timing (issue #39, items 6, 8, 9): a request that cannot
travel fails in its sender at once; READY announces only requests that left the backlog; a
gateway keeps nothing it never reads; replies after a cancel go nowhere. Each failed before
its fix."""

from __future__ import annotations

import random
import time

import pytest

from bus import codec
from bus import constants as c
from bus.bus_client import BusClient
from bus.codec import ProtocolError
from bus.endpoint import Endpoint
from bus.endpoint_core import EndpointCore
from bus.liveness import HeartbeatConfig
from bus.messages import Cancel, Direct, Disconnect, Error, Heartbeat, Partial, Ready, Request

HB = HeartbeatConfig(interval_s=0.25, liveness=3)


def decoded(core: EndpointCore) -> list:
    return [codec.decode([bytes(f) for f in frames]) for frames in core.take_outbox()]


def _client(clock, **options) -> EndpointCore:
    core = EndpointCore("gateway", "g1", heartbeat=HB, rng=random.Random(1), **options)
    core.on_socket_opened(clock.now)
    core.take_outbox()
    return core


# -- item 8: READY's pending ------------------------------------------------------------------

def test_ready_does_not_announce_a_request_still_in_the_backlog(clock):
    core = _client(clock)
    core.on_frames(codec.encode(Heartbeat()), clock.now)        # registered
    core.request(Request("decode", "sent", None), clock.now)
    core.on_frames(codec.encode(Disconnect(c.DisconnectReason.NOT_REGISTERED, "restart")), clock.now)
    core.request(Request("decode", "waiting", None), clock.now)   # backlogged
    core.on_socket_opened(clock.now)
    (ready,) = [m for m in decoded(core) if isinstance(m, Ready)]
    assert ready.pending == ("sent",)
    core.on_frames(codec.encode(Heartbeat()), clock.now)
    assert [m.request_id for m in decoded(core) if isinstance(m, Request)] == ["waiting"]


def test_a_request_pushed_out_of_a_full_backlog_ends_its_stream(clock):
    core = _client(clock, max_backlog=2)
    for rid in ("r1", "r2", "r3"):
        core.request(Request("decode", rid, None), clock.now)
    (error,) = core.take_events()
    assert (error.request_id, error.code) == ("r1", c.ErrorCode.BACKLOG_FULL)
    assert "r1" not in core.streams and core.metrics["dropped.backlog_full"] == 1


def test_cancelling_a_request_that_never_left_takes_it_back(clock):
    core = _client(clock)
    core.request(Request("decode", "r1", None), clock.now)
    core.cancel("r1", clock.now)
    core.on_frames(codec.encode(Heartbeat()), clock.now)
    assert [m for m in decoded(core) if isinstance(m, Request | Cancel)] == []


# -- item 9: a gateway serves nothing ----------------------------------------------------------

def test_a_gateway_endpoint_keeps_no_request_direct_or_stray_error(clock):
    core = _client(clock)
    core.on_frames(codec.encode(Heartbeat()), clock.now)
    core.take_events()
    for message in (Request("gateway", "x", None, (), "p1"), Direct("p1", {"type": "kv_ready"}),
                    Error("", "unknown_node", "no node"), Error("nobody", "node_lost")):
        core.on_frames(codec.encode(message), clock.now)
    assert core.take_events() == [] and core.serving == {}
    assert core.metrics["dropped.not_served"] == 2


def test_a_reply_that_cannot_be_encoded_ends_the_stream_with_an_error(clock):
    core = EndpointCore("decode", "d1", heartbeat=HB, rng=random.Random(1))
    core.on_socket_opened(clock.now)
    core.on_frames(codec.encode(Heartbeat()), clock.now)
    core.on_frames(codec.encode(Request("decode", "r1", None, (), "g1")), clock.now)
    core.take_outbox()
    core.reply("r1", {"token": 2 ** 70}, (), False, clock.now)
    (error,) = decoded(core)
    assert (type(error), error.code) == (Error, c.ErrorCode.INTERNAL) and "r1" not in core.serving


# -- item 6: what the bus cannot carry fails in the sender ------------------------------------

def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("body, key", [
    ({"prompt": "\ud800"}, ""), ({"seed": 2 ** 70}, ""), ({"x": _deep(100)}, ""), ({"x": object()}, ""),
    (None, "s" * 129), (None, "\udcff"),
])
def test_a_request_the_bus_cannot_carry_raises_in_the_caller(body, key):
    endpoint = Endpoint("tcp://127.0.0.1:9", "gateway", "g1").start()
    try:
        with pytest.raises(ProtocolError):
            endpoint.request("decode", body, key=key)
        assert endpoint._streams == {}
    finally:
        endpoint.stop()


def test_replies_racing_a_cancel_reach_no_inbox(clock):
    """The cancel is applied on the I/O thread in order with the replies: a PARTIAL that arrives
    between the caller's cancel and the I/O thread running it goes to the dropped stream, and
    one after it is dropped by the core; neither reaches the inbox."""
    endpoint = Endpoint("tcp://127.0.0.1:9", "gateway", "g1")
    calls = []
    endpoint._call = lambda method, *args: calls.append((method, args))   # the I/O thread, by hand
    endpoint.core.on_socket_opened(0, clock.now)
    endpoint.core.on_frames(0, codec.encode(Heartbeat()), clock.now)
    stream = endpoint.request("decode", None, request_id="r1")
    for method, args in calls:
        method(*args, clock.now)
    calls.clear()
    stream.cancel()                                                     # the caller's thread
    endpoint.core.on_frames(0, codec.encode(Partial("r1", 0, {"i": 0})), clock.now)   # on the wire already
    endpoint._dispatch()
    for method, args in calls:                                          # the I/O thread catches up
        method(*args, clock.now)
    endpoint.core.on_frames(0, codec.encode(Partial("r1", 1, {"i": 1})), clock.now)
    endpoint._dispatch()
    assert len(endpoint.inbox) == 0 and endpoint._streams == {}
    assert endpoint.metrics()["dropped.unknown_request"] == 1


@pytest.mark.integration
def test_a_direct_or_request_to_a_gateway_never_reaches_its_inbox(broker_thread):
    with Endpoint(broker_thread.endpoint, "prefill", "p1") as sender, \
            BusClient(broker_thread.endpoint, "g1") as client:
        assert sender.wait_registered(10)
        sender.send_direct("g1", {"type": "kv_ready"})
        stream = sender.request("gateway", None)
        with pytest.raises(Exception) as info:
            stream.collect()
        assert getattr(info.value, "code", None) == c.ErrorCode.NO_NODE
        time.sleep(0.2)
        assert len(client.endpoint.inbox) == 0
        assert isinstance(sender.receive(timeout=2), Error)   # the DIRECT was refused: forbidden
