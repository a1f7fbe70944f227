"""BrokerCore's deferred-request queue with a fake clock: a policy that raises `Defer` parks the
request; it is dispatched on CAPACITY, join or tick, refused `overloaded` when the queue is full
or the wait times out, and dropped when its client cancels or leaves."""

from __future__ import annotations

import pytest

from bus import constants as c
from bus.broker_core import BrokerCore
from bus.liveness import HeartbeatConfig
from bus.messages import Cancel, CapacityUpdate, Error, Final, Request
from bus.routing import Defer, Refuse
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
W, W2, G = b"worker", b"worker2", b"gateway"
MAX_QUEUED, TIMEOUT_S, RETRY_AFTER_S = 2, 5.0, 1.5


class SlotsPolicy:
    """Serves on a node whose capacity has `slots` > 0 (spending one); defers otherwise."""

    def __init__(self):
        self.refuse_next = False

    def on_join(self, node): pass
    def on_leave(self, node, reason): pass
    def on_capacity(self, node): pass

    def choose(self, service, key, request_id, candidates):
        if self.refuse_next:
            raise Refuse("bad_key", "refused at dispatch")
        for node in candidates:
            if node.capacity.get("slots", 0) > len(node.serving):
                return node
        raise Defer(MAX_QUEUED, TIMEOUT_S, RETRY_AFTER_S, "every node is full")


@pytest.fixture
def broker(clock):
    driver = BrokerDriver(BrokerCore(HB, SlotsPolicy()), clock)
    driver.register(W, "decode", "d1", capacity={"slots": 0})
    driver.register(G, "gateway", "g1")
    driver.outgoing()
    return driver


def _forwarded(broker, identity):
    return [m.request_id for m in broker.to(identity) if isinstance(m, Request)]


def test_a_deferred_request_waits_and_goes_out_when_capacity_frees(broker):
    broker.send(G, Request("decode", "r1", body={"x": 1}, key="s1"))
    assert broker.outgoing() == [] and len(broker.core.queue) == 1
    assert broker.core.routes == {} and broker.core.metrics["queue.deferred"] == 1
    broker.send(W, CapacityUpdate({"slots": 1}))
    out = broker.outgoing()
    assert out == [(W, Request("decode", "r1", body={"x": 1}, peer="g1", key="s1"))]
    assert b"r1" in broker.core.routes and len(broker.core.queue) == 0
    assert broker.core.metrics["queue.dispatched"] == 1


def test_queued_requests_leave_in_arrival_order_as_capacity_allows(broker):
    broker.send(G, Request("decode", "r1"))
    broker.send(G, Request("decode", "r2"))
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert _forwarded(broker, W) == ["r1"]
    broker.send(W, Final("r1", 0))
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert _forwarded(broker, W) == ["r2"]


def test_a_joining_node_takes_the_waiting_requests(broker):
    broker.send(G, Request("decode", "r1"))
    broker.register(W2, "decode", "d2", capacity={"slots": 4})
    assert _forwarded(broker, W2) == ["r1"]


def test_capacity_freed_without_a_report_is_found_on_the_next_tick(broker):
    broker.send(W, CapacityUpdate({"slots": 1}))
    broker.send(G, Request("decode", "r1"))
    broker.send(G, Request("decode", "r2"))
    assert _forwarded(broker, W) == ["r1"]
    broker.send(W, Final("r1", 0))          # the stream ended; no CAPACITY follows
    broker.outgoing()
    broker.tick(HB.tick_s)
    assert _forwarded(broker, W) == ["r2"]


def test_a_full_queue_answers_overloaded_with_a_retry_hint(broker):
    for i in range(MAX_QUEUED + 1):
        broker.send(G, Request("decode", f"r{i}"))
    (error,) = broker.to(G)
    assert error == Error(f"r{MAX_QUEUED}", "overloaded",
                          f"every node is full; {MAX_QUEUED} requests already waiting",
                          {"retry_after_s": RETRY_AFTER_S})
    assert len(broker.core.queue) == MAX_QUEUED
    assert broker.core.metrics["rejected.overloaded"] == 1


def test_a_request_that_waits_too_long_is_answered_overloaded(broker):
    broker.send(G, Request("decode", "r1"))
    broker.keep_alive(TIMEOUT_S - 0.2, W, G)
    assert [m for m in broker.to(G) if isinstance(m, Error)] == []
    broker.keep_alive(0.4, W, G)
    errors = [m for m in broker.to(G) if isinstance(m, Error)]
    assert [(e.request_id, e.code, e.details) for e in errors] == [
        ("r1", "overloaded", {"retry_after_s": RETRY_AFTER_S})]
    assert len(broker.core.queue) == 0 and broker.core.metrics["queue.timed_out"] == 1


def test_deferred_again_keeps_its_place_and_its_deadline(broker):
    broker.send(G, Request("decode", "r1"))
    broker.keep_alive(TIMEOUT_S / 2, W, G)
    broker.send(G, Request("decode", "r2"))
    broker.send(W, CapacityUpdate({"slots": 0}))   # offered again, deferred again
    broker.keep_alive(TIMEOUT_S / 2 + 0.2, W, G)
    assert [m.request_id for m in broker.to(G) if isinstance(m, Error)] == ["r1"]
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert _forwarded(broker, W) == ["r2"]


def test_a_cancelled_queued_request_never_reaches_a_node(broker):
    broker.send(G, Request("decode", "r1"))
    broker.send(G, Cancel("r1", c.CancelReason.CLIENT))
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert broker.outgoing() == []
    assert broker.core.metrics["queue.cancelled"] == 1
    assert broker.core.metrics["dropped.unknown_request"] == 0


def test_only_the_client_may_cancel_its_queued_request(broker):
    broker.send(G, Request("decode", "r1"))
    broker.send(W, Cancel("r1", c.CancelReason.CLIENT))
    assert len(broker.core.queue) == 1


def test_a_departed_clients_queued_requests_are_dropped(broker):
    broker.send(G, Request("decode", "r1"))
    broker.keep_alive(1.0, W)                     # the gateway goes silent and expires
    assert "g1" not in broker.core.nodes_by_id and len(broker.core.queue) == 0
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert _forwarded(broker, W) == []


def test_a_reconnecting_client_keeps_its_place_and_gets_the_stream(broker):
    broker.send(G, Request("decode", "r1"))
    broker.register(b"gateway-new-socket", "gateway", "g1", pending=("r1",))
    broker.send(W, CapacityUpdate({"slots": 1}))
    broker.outgoing()
    broker.send(W, Final("r1", 0))
    assert [dest for dest, m in broker.outgoing() if isinstance(m, Final)] == [b"gateway-new-socket"]


def test_a_queued_request_id_is_still_in_use(broker):
    broker.send(G, Request("decode", "r1"))
    broker.send(G, Request("decode", "r1"))
    assert [m.code for m in broker.to(G)] == [c.ErrorCode.DUPLICATE_REQUEST]


def test_a_queued_request_whose_nodes_all_left_gets_no_node(broker):
    broker.send(G, Request("decode", "r1"))
    broker.keep_alive(3.1, G)                     # the only decode node (idle) expires
    assert [(m.request_id, m.code) for m in broker.to(G) if isinstance(m, Error)] == [
        ("r1", c.ErrorCode.NO_NODE)]
    assert broker.core.metrics["rejected.no_node.decode"] == 1


def test_a_policy_may_refuse_a_queued_request_when_it_is_offered_again(broker):
    broker.send(G, Request("decode", "r1"))
    broker.core.policy.refuse_next = True
    broker.send(W, CapacityUpdate({"slots": 1}))
    assert [(m.request_id, m.code) for m in broker.to(G)] == [("r1", "bad_key")]
    assert len(broker.core.queue) == 0 and broker.core.metrics["queue.dispatched"] == 0


def test_nothing_waits_in_a_queue_the_policy_never_defers_into(clock):
    driver = BrokerDriver(BrokerCore(HB), clock)
    driver.register(W, "decode", "d1")
    driver.register(G, "gateway", "g1")
    driver.outgoing()
    driver.send(G, Request("decode", "r1"))
    driver.tick(HB.tick_s)
    assert len(driver.core.queue) == 0 and _forwarded(driver, W) == ["r1"]
