"""EndpointSet with a fake clock over an in-memory network of two real BrokerCores: requests
spread over the brokers, replies go back the way their request came, and when a broker dies
mid-stream everything its links held moves to the other (ADOPT, the replay window), so the
client's stream goes on with no token lost or repeated (docs/PROTOCOL.md §1.12)."""

from __future__ import annotations

import random

import pytest

from bus.broker_core import BrokerCore
from bus.endpoint_core import LinkDown, LinkUp
from bus.endpoint_set import EndpointSet
from bus.liveness import HeartbeatConfig
from bus.messages import Cancel, Error, Final, Partial, Request

HB = HeartbeatConfig(interval_s=0.25, liveness=3)


class Net:
    """Endpoint sets and brokers joined by in-memory links; a dead broker drops everything."""

    def __init__(self, clock, num_brokers: int = 2) -> None:
        self.clock = clock
        self.brokers = [BrokerCore(HB) for _ in range(num_brokers)]
        self.alive = [True] * num_brokers
        self.sets: dict[str, EndpointSet] = {}
        self.events: dict[str, list] = {}

    def add(self, role: str, node_id: str) -> EndpointSet:
        endpoints = EndpointSet(role, node_id, len(self.brokers), heartbeat=HB, rng=random.Random(1))
        self.sets[node_id], self.events[node_id] = endpoints, []
        for index in range(len(self.brokers)):
            endpoints.on_socket_opened(index, self.clock.now)
        return endpoints

    def pump(self, rounds: int = 6) -> None:
        for _ in range(rounds):
            for node_id, endpoints in self.sets.items():
                for index, frames in endpoints.take_outbox():
                    if self.alive[index]:
                        self.brokers[index].on_frames(f"{node_id}/{index}".encode(), frames, self.clock.now)
            for index, broker in enumerate(self.brokers):
                for identity, *frames in broker.take_outbox():
                    if self.alive[index]:
                        node_id = identity.decode().rsplit("/", 1)[0]
                        self.sets[node_id].on_frames(index, frames, self.clock.now)
            for node_id, endpoints in self.sets.items():
                self.events[node_id] += endpoints.take_events()

    def run(self, seconds: float, step: float = 0.05) -> None:
        end = self.clock.now + seconds
        while self.clock.now < end - 1e-9:
            self.clock.advance(step)
            for index, broker in enumerate(self.brokers):
                if self.alive[index]:
                    broker.tick(self.clock.now)
            for endpoints in self.sets.values():
                for index in endpoints.tick(self.clock.now):
                    endpoints.on_socket_opened(index, self.clock.now)
            self.pump()

    def take(self, node_id: str, kind=None) -> list:
        events, self.events[node_id] = self.events[node_id], []
        return [e for e in events if kind is None or isinstance(e, kind)]


@pytest.fixture
def net(clock):
    net = Net(clock)
    net.add("decode", "d1")
    net.add("gateway", "g1")
    net.pump()
    assert all(len(b.nodes_by_id) == 2 for b in net.brokers)   # everyone registered with every broker
    assert net.take("g1", LinkUp) == [LinkUp()]
    return net


def start(net: Net, *request_ids: str) -> None:
    for request_id in request_ids:
        net.sets["g1"].request_encoded(request_id, codec_request(request_id), net.clock.now)
    net.pump()
    assert sorted(e.request_id for e in net.take("d1", Request)) == sorted(request_ids)


def codec_request(request_id: str) -> list:
    from bus import codec
    return codec.encode(Request("decode", request_id, {"n": 1}))


def tokens(net: Net, request_ids, first: int, count: int) -> None:
    for i in range(first, first + count):
        net.sets["d1"].reply_batch([(r, {"i": i}) for r in request_ids], net.clock.now)
        net.pump()


def received(events) -> dict[str, list]:
    seen: dict[str, list] = {}
    for event in events:
        if isinstance(event, Partial | Final):
            seen.setdefault(event.request_id, []).append(event.seq)
    return seen


def test_requests_take_the_brokers_in_turn_and_replies_come_back_the_same_way(net):
    start(net, "r1", "r2", "r3", "r4")
    assert [b.metrics["routed.request"] for b in net.brokers] == [2, 2]
    tokens(net, ["r1", "r2", "r3", "r4"], 0, 3)
    assert received(net.take("g1")) == {r: [0, 1, 2] for r in ("r1", "r2", "r3", "r4")}
    assert [b.metrics["routed.streams"] for b in net.brokers] == [3, 3]   # one batch a step a broker


def test_a_cancel_goes_through_the_broker_its_request_took(net):
    start(net, "r1", "r2")
    net.sets["g1"].cancel("r2", net.clock.now)
    net.pump()
    assert [e.request_id for e in net.take("d1", Cancel)] == ["r2"]
    assert net.brokers[1].metrics["routed.cancel"] == 1 and net.sets["g1"].via == {"r1": 0}


def test_a_broker_killed_mid_stream_loses_no_token_and_repeats_none(net):
    start(net, "r1", "r2")                 # r1 through broker 0, r2 through broker 1
    tokens(net, ["r1", "r2"], 0, 3)
    net.alive[0] = False                   # kill -9: what it had queued is gone
    tokens(net, ["r1", "r2"], 3, 2)        # sent into the dead broker's socket before anyone knows
    net.run(HB.expiry_s + 3 * HB.tick_s)   # the links expire: everything moves to broker 1
    tokens(net, ["r1", "r2"], 5, 2)
    for request_id in ("r1", "r2"):
        net.sets["d1"].reply(request_id, {"done": True}, (), True, net.clock.now)
    net.pump()
    events = net.take("g1")
    assert received(events) == {r: list(range(8)) for r in ("r1", "r2")}
    assert not [e for e in events if isinstance(e, Error | LinkDown)]   # one broker left: still up
    assert net.brokers[1].metrics["adopted.requests"] == 2 and net.brokers[1].routes == {}
    assert net.sets["d1"].all_metrics()["failover.handovers"] == 1


def test_new_requests_avoid_a_dead_broker_and_it_rejoins_when_back(net, clock):
    net.alive[0] = False
    net.run(HB.expiry_s + 3 * HB.tick_s)
    start(net, "r1", "r2")
    assert net.brokers[1].metrics["routed.request"] == 2
    net.alive[0] = True                    # back (restarted: it knows nobody)
    net.brokers[0] = BrokerCore(HB)
    net.run(2 * HB.expiry_s + HB.backoff_cap_s)
    assert len(net.brokers[0].nodes_by_id) == 2 and net.brokers[0].routes == {}
    tokens(net, ["r1", "r2"], 0, 1)
    assert received(net.take("g1")) == {"r1": [0], "r2": [0]}


def test_with_every_broker_gone_the_link_is_down_and_the_requests_wait(net):
    start(net, "r1")
    net.alive = [False, False]
    net.run(HB.expiry_s + 3 * HB.tick_s)
    assert net.take("g1", LinkDown) and not net.sets["g1"].registered
    net.sets["g1"].request_encoded("r2", codec_request("r2"), net.clock.now)   # backlogged
    net.alive = [False, True]
    net.brokers[1] = BrokerCore(HB)
    net.run(2 * HB.backoff_cap_s)
    assert net.take("g1", LinkUp) == [LinkUp()]
    assert [e.request_id for e in net.take("d1", Request)] == ["r2"]
    assert net.brokers[1].nodes_by_id["d1"].serving == {b"r1", b"r2"}   # r1 re-announced, r2 routed


def test_a_gateway_may_not_adopt_requests_it_serves(net):
    from bus import codec
    from bus.messages import Adopt
    net.brokers[0].on_frames(b"g1/0", codec.encode(Adopt(inflight=("x",))), net.clock.now)
    assert "g1" not in net.brokers[0].nodes_by_id and net.brokers[0].metrics["dropped.malformed"] == 1


def test_the_set_ticks_at_its_busiest_links_pace(net):
    decode = net.sets["d1"]
    assert decode.tick_interval() == HB.idle_interval_s / 5   # both links idle
    assert net.sets["g1"].tick_interval() == HB.tick_s          # a gateway's links never idle
    start(net, "r1")
    assert decode.tick_interval() == HB.tick_s                  # the link r1 came by carries work
