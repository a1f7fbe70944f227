"""The broker's own stats service: live nodes by role and waiting requests, answered in one FINAL."""

from __future__ import annotations

from bus import constants as c
from bus.broker_core import BrokerCore
from bus.liveness import HeartbeatConfig
from bus.messages import Final, Request
from tests.bus.broker_helpers import BrokerDriver

G, W1, W2 = b"gw", b"w1", b"w2"


def test_stats_count_live_nodes_by_role_and_route_nothing(clock):
    broker = BrokerDriver(BrokerCore(HeartbeatConfig(interval_s=0.25, liveness=3)), clock)
    broker.register(W1, "decode", "d1")
    broker.register(W2, "prefill", "p1")
    broker.register(G, "gateway", "g1")
    broker.outgoing()
    broker.send(G, Request(c.BROKER_STATS_SERVICE, "s1"))
    (answer,) = broker.to(G)
    assert isinstance(answer, Final) and answer.request_id == "s1"
    assert answer.body["nodes_by_role"] == {"decode": 1, "prefill": 1, "gateway": 1}
    assert answer.body["queued_by_service"]["decode"] == 0 and answer.body["num_routes"] == 0
    assert broker.core.metrics["answered.stats"] == 1 and broker.core.metrics["routed.request"] == 0


def test_stats_list_each_serving_nodes_last_capacity_bounded_in_number(clock, monkeypatch):
    broker = BrokerDriver(BrokerCore(HeartbeatConfig(interval_s=0.25, liveness=3)), clock)
    broker.register(W1, "decode", "d1", capacity={"kv_blocks_free": 7})
    broker.register(W2, "prefill", "p1", capacity={"queued_tokens": 3, "prefix_cached_tokens": 32})
    broker.register(G, "gateway", "g1")
    broker.outgoing()
    broker.send(G, Request(c.BROKER_STATS_SERVICE, "s1"))
    (answer,) = broker.to(G)
    assert answer.body["capacity_by_node"] == {"d1": {"kv_blocks_free": 7},
                                               "p1": {"queued_tokens": 3, "prefix_cached_tokens": 32}}
    monkeypatch.setattr(c, "MAX_STATS_NODES", 1)
    broker.send(G, Request(c.BROKER_STATS_SERVICE, "s2"))
    (answer,) = broker.to(G)
    assert list(answer.body["capacity_by_node"]) == ["d1"]   # the first by node id
