"""Endpoint cores and a broker core wired through an in-memory network with a fake clock:
the whole control plane without sockets, including a broker restart in the middle of a stream."""

from __future__ import annotations

import random

from bus import constants as c
from bus.broker_core import BrokerCore
from bus.endpoint_core import EndpointCore
from bus.liveness import HeartbeatConfig
from bus.messages import Error, Final, Partial, Request

HB = HeartbeatConfig(interval_s=0.25, liveness=3)


class Network:
    """Delivers frames instantly between endpoint cores and the broker; a node that is
    'frozen' neither sends nor receives; the broker can be replaced (restart)."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.broker = BrokerCore(HB)
        self.nodes: dict[bytes, EndpointCore] = {}
        self.frozen: set[bytes] = set()
        self.events: dict[bytes, list] = {}

    def add(self, identity: bytes, role: str, node_id: str) -> EndpointCore:
        core = EndpointCore(role, node_id, heartbeat=HB, rng=random.Random(0))
        self.nodes[identity] = core
        self.events[identity] = []
        core.on_socket_opened(self.clock.now)
        return core

    def pump(self) -> None:
        for _ in range(100):
            moved = False
            for identity, core in self.nodes.items():
                if identity in self.frozen:
                    continue
                self.events[identity].extend(core.take_events())
                for frames in core.take_outbox():
                    moved = True
                    self.broker.on_frames(identity, frames, self.clock.now)
            for identity, *frames in self.broker.take_outbox():
                if identity in self.nodes and identity not in self.frozen:
                    moved = True
                    self.nodes[identity].on_frames(frames, self.clock.now)
            if not moved:
                return

    def run(self, seconds: float, step: float = 0.05) -> None:
        end = self.clock.now + seconds
        while self.clock.now < end - 1e-9:
            self.clock.advance(step)
            for identity, core in self.nodes.items():
                if identity not in self.frozen and core.tick(self.clock.now):
                    core.on_socket_opened(self.clock.now)
            self.broker.tick(self.clock.now)
            self.pump()

    def restart_broker(self) -> None:
        self.broker = BrokerCore(HB)


def test_register_stream_and_finish(clock):
    net = Network(clock)
    worker, client = net.add(b"w", "decode", "d1"), net.add(b"g", "gateway", "g1")
    net.run(0.1)
    assert worker.registered and client.registered
    client.request(Request("decode", "r1", {"n": 2}), clock.now)
    net.pump()
    (request,) = [e for e in net.events[b"w"] if isinstance(e, Request)]
    worker.reply("r1", "a", (), False, clock.now)
    worker.reply("r1", "b", (), True, clock.now)
    net.pump()
    assert [(type(e).__name__, e.body) for e in net.events[b"g"] if isinstance(e, Partial | Final)] == [
        ("Partial", "a"), ("Final", "b")]


def test_links_stay_up_for_minutes_of_idle_time(clock):
    net = Network(clock)
    worker = net.add(b"w", "decode", "d1")
    net.run(120)
    assert worker.registered and worker.metrics["link.registered"] == 1
    assert net.broker.metrics["nodes.left"] == 0


def test_frozen_node_is_declared_dead_then_reregisters_when_thawed(clock):
    net = Network(clock)
    worker, client = net.add(b"w", "decode", "d1"), net.add(b"g", "gateway", "g1")
    net.run(0.1)
    client.request(Request("decode", "r1"), clock.now)
    net.pump()
    net.frozen.add(b"w")
    net.run(0.85)
    assert "d1" not in net.broker.nodes_by_id
    assert [e.code for e in net.events[b"g"] if isinstance(e, Error)] == [c.ErrorCode.NODE_LOST]
    net.frozen.clear()
    net.run(1.0)
    assert "d1" in net.broker.nodes_by_id and worker.registered


def test_broker_restart_mid_stream_rebuilds_routes_and_the_stream_continues(clock):
    net = Network(clock)
    worker, client = net.add(b"w", "decode", "d1"), net.add(b"g", "gateway", "g1")
    net.run(0.1)
    client.request(Request("decode", "r1"), clock.now)
    net.pump()
    worker.reply("r1", "t0", (), False, clock.now)
    net.pump()
    net.restart_broker()
    net.run(HB.expiry_s)   # within one liveness window both are back
    assert {"d1", "g1"} <= set(net.broker.nodes_by_id)
    assert net.broker.routes[b"r1"].client is not None and net.broker.routes[b"r1"].server is not None
    worker.reply("r1", "t1", (), True, clock.now)
    net.pump()
    assert [(e.seq, e.body) for e in net.events[b"g"] if isinstance(e, Partial | Final)] == [(0, "t0"), (1, "t1")]
