"""The broker survives its worst peer (issue #39, items 2, 3, 4, 8, 9): a routing policy that
fails, peer-chosen strings and bodies, a key taking over another node's id, a request announced
before it was sent, and traffic aimed at a gateway. Each test failed before its fix."""

from __future__ import annotations

import math

import pytest

from bus import codec
from bus import constants as c
from bus.broker_core import BrokerCore
from bus.constants import Command
from bus.liveness import HeartbeatConfig
from bus.messages import CapacityUpdate, Direct, Disconnect, Error, Final, Heartbeat, Request
from scheduler.policy import ClusterPolicy
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
D, P, G, G2 = b"decode", b"prefill", b"gateway", b"gateway2"


@pytest.fixture
def cluster(clock):
    driver = BrokerDriver(BrokerCore(HB, ClusterPolicy()), clock)
    driver.register(D, "decode", "d1")
    driver.register(P, "prefill", "p1")
    driver.register(G, "gateway", "g1")
    driver.outgoing()
    return driver


def _errors(driver, identity):
    return [m for m in driver.to(identity) if isinstance(m, Error)]


def _request(driver, rid, service="decode", key=""):
    driver.send(G, Request(service, rid, {"x": 1}, (), "", key))


def test_a_prefill_key_too_long_for_int_is_refused_not_a_crash(cluster):
    _request(cluster, "r1", "prefill", key="1" * 5000)   # int() refuses more than 4300 digits
    assert [(e.request_id, e.code) for e in _errors(cluster, G)] == [("r1", c.ErrorCode.MALFORMED)]
    _request(cluster, "r2", "decode", key="s")
    assert [m.request_id for m in cluster.to(D)] == ["r2"]   # still serving


def test_a_huge_prompt_length_counts_as_the_estimate(clock):
    """A client cannot make a prefill node look busy forever with one absurd length."""
    driver = BrokerDriver(BrokerCore(HB, ClusterPolicy()), clock)
    for identity, node_id in ((P, "p1"), (b"p2", "p2"), (G, "g1")):
        driver.register(identity, "gateway" if identity == G else "prefill", node_id)
    _request(driver, "r1", "prefill", key="9" * 100)
    _request(driver, "r2", "prefill", key="9" * 100)
    loads = driver.core.policy.prefill_loads._routed_since_report
    assert sorted(loads.values()) == [256, 256]


class ExplodingPolicy:
    def on_join(self, node): ...

    def on_leave(self, node, reason): ...

    def on_capacity(self, node):
        raise RuntimeError("bad capacity")

    def choose(self, service, key, request_id, candidates):
        if key == "boom":
            raise ZeroDivisionError
        return candidates[0]


def test_a_policy_error_becomes_an_error_for_that_request_only(clock):
    driver = BrokerDriver(BrokerCore(HB, ExplodingPolicy()), clock)
    driver.register(D, "decode", "d1")
    driver.register(G, "gateway", "g1")
    driver.outgoing()
    _request(driver, "r1", key="boom")
    (error,) = _errors(driver, G)
    assert (error.request_id, error.code) == ("r1", c.ErrorCode.INTERNAL)
    driver.send(D, CapacityUpdate({"kv_blocks_free": 3}))   # on_capacity raises: counted
    _request(driver, "r2", key="fine")
    assert [m.request_id for m in driver.to(D)] == ["r2"]
    assert driver.core.metrics["failed.policy"] == 2 and b"r1" not in driver.core.routes


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_capacity_is_refused_when_decoded(cluster, value):
    """Refused like any undecodable CAPACITY (§1.7): DISCONNECT malformed, the node registers again."""
    cluster.send(D, CapacityUpdate({"kv_blocks_free": value}))
    assert cluster.core.metrics["dropped.malformed"] == 1
    assert [m.reason for m in cluster.to(D)] == [c.DisconnectReason.MALFORMED]
    cluster.register(D, "decode", "d1")
    _request(cluster, "r1", key="s")
    assert [m.request_id for m in cluster.to(D) if isinstance(m, Request)] == ["r1"]


def test_unknown_services_share_one_counter(cluster):
    for i in range(200):
        _request(cluster, f"r{i}", service=f"service-{i}")
    assert cluster.core.metrics["rejected.no_node.other"] == 200
    assert not [k for k in cluster.core.metrics if "service-" in k]


@pytest.mark.parametrize("service, key", [("s" * 129, ""), ("decode", "k" * 129)])
def test_service_and_key_are_bounded(cluster, service, key):
    cluster.send_raw(G, [codec.HEADERS[Command.REQUEST], service.encode(), b"r1", b"", key.encode(),
                         codec.pack(None)])
    (error,) = _errors(cluster, G)
    assert (error.request_id, error.code) == ("r1", c.ErrorCode.MALFORMED)
    assert cluster.to(D) == []


def test_a_ready_body_over_its_bound_is_refused_before_unpacking(cluster):
    body = codec.pack({"role": "gateway", "node_id": "big", "pending": ["x" * 100] * 200_000})
    assert len(body) > c.MAX_READY_BYTES
    cluster.send_raw(b"big", [codec.HEADERS[Command.READY], body])
    assert cluster.to(b"big") == [Disconnect(c.DisconnectReason.MALFORMED, f"READY body over {c.MAX_READY_BYTES} bytes")]


def test_a_gateway_cannot_announce_requests_it_would_serve(cluster):
    cluster.register(G2, "gateway", "g2", inflight=("stolen",))
    assert [type(m) for m in cluster.to(G2)] == [Disconnect] and "g2" not in cluster.core.nodes_by_id


def test_a_body_nested_too_deep_is_malformed_when_decoded():
    """repr() of such a body raises RecursionError, inside the very handlers that log it."""
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    frames = [codec.HEADERS[Command.DIRECT], b"d1", codec.msgpack.packb({"type": "kv_ready", "x": deep})]
    with pytest.raises(codec.ProtocolError):
        codec.decode(frames)
    codec.decode(frames[:2] + [codec.pack({"deep": _nest(c.MAX_BODY_DEPTH - 1)})])   # within the bound


def _nest(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


# -- identity: node ids are bound to the key that first registered them ---------------------

def _keyed_core(clock):
    keys = {b"id-a": "key-a", b"id-a2": "key-a", b"id-b": "key-b"}
    core = BrokerCore(HB, identify=lambda frame: keys.get(frame.identity))
    return core


class KeyedFrame(bytes):
    """A header frame carrying the sender's key, as zmq.Frame's User-Id does under CURVE."""

    identity: bytes


def _ready_from(core, identity, node_id, role="decode", now=0.0):
    header = KeyedFrame(codec.HEADERS[Command.READY])
    header.identity = identity
    core.on_frames(identity, [header, codec.pack({"role": role, "node_id": node_id})], now)
    return [codec.decode([bytes(f) for f in m[1:]]) for m in core.take_outbox() if m[0] == identity]


def test_another_key_cannot_take_over_a_node_id(clock):
    core = _keyed_core(clock)
    assert _ready_from(core, b"id-a", "decode-0") == [Heartbeat()]
    (answer,) = _ready_from(core, b"id-b", "decode-0")
    assert answer.reason == c.DisconnectReason.FORBIDDEN
    assert core.nodes_by_id["decode-0"].identity == b"id-a"
    assert _ready_from(core, b"id-a2", "decode-0") == [Heartbeat()]   # its own key, a new socket
    core.on_frames(b"id-a2", codec.encode(Disconnect("shutdown")), 1.0)
    (answer,) = _ready_from(core, b"id-b", "decode-0", now=2.0)      # still bound after it left
    assert answer.reason == c.DisconnectReason.FORBIDDEN and core.metrics["dropped.forbidden"] == 2


# -- a request announced before it was sent (item 8) ----------------------------------------

def test_a_pending_request_sent_after_the_ready_is_routed_not_duplicate(cluster):
    cluster.register(G2, "gateway", "g2", pending=("early",))   # a restarted broker sees its READY
    cluster.outgoing()
    cluster.send(G2, Request("decode", "early", None))
    assert [m.request_id for m in cluster.to(D)] == ["early"]
    assert cluster.core.metrics["rejected.duplicate_request"] == 0


def test_a_real_duplicate_is_still_refused(cluster):
    _request(cluster, "r1")
    _request(cluster, "r1")
    assert [e.code for e in _errors(cluster, G)] == [c.ErrorCode.DUPLICATE_REQUEST]


# -- nothing is routed to a gateway (item 9) --------------------------------------------------

def test_requests_and_directs_never_reach_a_gateway(cluster):
    _request(cluster, "r1", service="gateway")
    assert [e.code for e in _errors(cluster, G)] == [c.ErrorCode.NO_NODE]
    cluster.send(P, Direct("g1", {"type": "kv_ready"}))
    assert cluster.to(G) == []


# -- memory held for peers is bounded ---------------------------------------------------------

def test_held_directs_are_bounded_in_bytes(cluster):
    big = b"x" * (8 << 20)
    for _ in range(20):
        cluster.send(P, Direct("not-yet", None, (big,)))
    assert cluster.core.held_directs.num_bytes <= 64 << 20
    assert cluster.core.metrics["rejected.unknown_node"] >= 12


def test_a_failing_handler_is_contained(cluster, monkeypatch):
    def explode(*args):
        raise KeyError("bug")

    monkeypatch.setitem(cluster.core._handlers, Command.REQUEST, explode)
    _request(cluster, "r1")
    assert [e.code for e in _errors(cluster, G)] == [c.ErrorCode.INTERNAL]
    monkeypatch.undo()
    _request(cluster, "r2")
    assert [m.request_id for m in cluster.to(D)] == ["r2"]
    assert cluster.core.metrics["failed.handler"] == 1


def test_a_final_still_reaches_the_client(cluster):
    _request(cluster, "r1")
    cluster.outgoing()
    cluster.send(D, Final("r1", 0, {"ok": True}))
    assert [type(m) for m in cluster.to(G)] == [Final]
