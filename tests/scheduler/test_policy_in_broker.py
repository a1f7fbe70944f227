"""ClusterPolicy inside a BrokerCore, driven by hand with a fake clock: full decode nodes defer
requests into the broker queue, freed capacity dispatches them, a full queue or a long wait is
answered `overloaded` with `retry_after_s`, a node that answers `full` is skipped on the retry,
and a cluster without prefill nodes answers `no_node` (counted as a fallback)."""

from __future__ import annotations

import pytest

from bus.broker_core import BrokerCore
from bus.liveness import HeartbeatConfig
from bus.messages import CapacityUpdate, Error, Request
from scheduler.policy import ClusterPolicy, SchedulerSettings
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
D1, D2, P1, G = b"d1-socket", b"d2-socket", b"p1-socket", b"gateway"
FULL = {"kv_blocks_total": 64, "kv_blocks_free": 0, "max_running": 4, "num_running": 4}
ROOMY = {"kv_blocks_total": 64, "kv_blocks_free": 32, "max_running": 4, "num_running": 0}
SETTINGS = SchedulerSettings(queue_size=2, queue_timeout_s=3.0, retry_after_s=0.75)


@pytest.fixture
def broker(clock):
    driver = BrokerDriver(BrokerCore(HB, ClusterPolicy(SETTINGS)), clock)
    driver.register(D1, "decode", "d1", capacity=ROOMY)
    driver.register(D2, "decode", "d2", capacity=ROOMY)
    driver.register(G, "gateway", "g1")
    driver.outgoing()
    return driver


def _routed(broker):
    return {m.request_id: dest for dest, m in broker.outgoing() if isinstance(m, Request)}


def _errors(broker):
    return [(m.request_id, m.code, dict(m.details)) for m in broker.to(G) if isinstance(m, Error)]


def test_a_node_that_reports_full_is_skipped_on_the_clients_retry(broker):
    broker.send(G, Request("decode", "r1", key="chat"))
    home = _routed(broker)["r1"]
    # The node says CAPACITY (full) first, then ERROR full; the client retries the same session.
    broker.send(home, CapacityUpdate(FULL))
    broker.send(home, Error("r1", "full", "no KV room"))
    broker.outgoing()
    broker.send(G, Request("decode", "r2", key="chat"))
    assert _routed(broker)["r2"] not in (home,)


def test_every_node_full_defers_and_freed_capacity_dispatches(broker):
    broker.send(D1, CapacityUpdate(FULL))
    broker.send(D2, CapacityUpdate(FULL))
    broker.send(G, Request("decode", "r1", key="chat"))
    assert _routed(broker) == {} and len(broker.core.queue) == 1
    broker.send(D2, CapacityUpdate(ROOMY))
    assert _routed(broker) == {"r1": D2}
    assert broker.core.metrics["queue.dispatched"] == 1


def test_past_the_queue_the_client_is_told_overloaded_with_a_retry_hint(broker):
    broker.send(D1, CapacityUpdate(FULL))
    broker.send(D2, CapacityUpdate(FULL))
    for i in range(3):
        broker.send(G, Request("decode", f"r{i}", key=f"chat-{i}"))
    assert _errors(broker) == [("r2", "overloaded", {"retry_after_s": 0.75})]


def test_a_request_that_waits_past_the_timeout_is_told_overloaded(broker):
    broker.send(D1, CapacityUpdate(FULL))
    broker.send(D2, CapacityUpdate(FULL))
    broker.send(G, Request("decode", "r1", key="chat"))
    broker.keep_alive(SETTINGS.queue_timeout_s + 0.2, D1, D2, G)
    assert _errors(broker) == [("r1", "overloaded", {"retry_after_s": 0.75})]
    assert broker.core.metrics["queue.timed_out"] == 1


def test_no_prefill_node_answers_no_node_and_counts_the_fallback(broker):
    broker.send(G, Request("prefill", "r1"))
    assert [code for _, code, _ in _errors(broker)] == ["no_node"]
    assert broker.core.metrics["rejected.no_node.prefill"] == 1


def test_prefill_requests_spread_by_outstanding_tokens(broker):
    broker.register(P1, "prefill", "p1", capacity={"queued_tokens": 5000})
    broker.register(b"p2-socket", "prefill", "p2", capacity={"queued_tokens": 0})
    broker.outgoing()
    broker.send(G, Request("prefill", "r1", key="6000"))
    broker.send(G, Request("prefill", "r2", key="6000"))
    assert _routed(broker) == {"r1": b"p2-socket", "r2": b"p1-socket"}
