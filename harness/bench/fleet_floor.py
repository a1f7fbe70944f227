"""Where the broker's heartbeat CPU goes: the I/O path's floor and the protocol logic alone.

Contract:
- `python -m harness.bench.fleet_floor ENDPOINT [IDLE_MS]`: a server on the broker's own shell (a
  ROUTER with the broker's options, `bus.reactor.RouterReactor` on uvloop, the same tick) around
  `LivenessCore`, which keeps only the liveness rules of idle links: a READY is acknowledged, each
  link gets a HEARTBEAT once nothing was sent to it for one idle interval (default 1000 ms).
  No validation, registry or policy. Its CPU under the same swarm is the floor any broker on this
  shell and libzmq pays for the traffic.
  Prints `ready` once bound; SIGTERM stops it.
- `core_cost(num_nodes, seconds)`: `BrokerCore` alone, in this process, fed the same steady state
  as bytes (every node heartbeats once an idle interval, `tick` every interval / 5): the percent of
  one core its `on_frames` and its `tick` take (no sockets, no event loop).
"""

from __future__ import annotations

import sys
import time

from bus import codec
from bus.broker_core import BrokerCore
from bus.constants import Command
from bus.liveness import HeartbeatConfig
from bus.messages import Ready

HEARTBEAT = codec.HEADERS[Command.HEARTBEAT]


class LivenessCore:
    """The liveness rules of docs/PROTOCOL.md §1.4 and nothing else (a `RouterReactor` core)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.last_sent: dict[bytes, float] = {}
        self.last_seen: dict[bytes, float] = {}
        self.outbox: list[list] = []

    def on_frames(self, identity: bytes, frames: list, now: float) -> None:
        if identity not in self.last_sent:   # a READY: acknowledge it
            self.last_sent[identity] = now
            self.outbox.append([identity, HEARTBEAT])
        self.last_seen[identity] = now

    def tick(self, now: float) -> None:
        for identity, sent in self.last_sent.items():
            if now - sent >= self.interval_s:
                self.last_sent[identity] = now
                self.outbox.append([identity, HEARTBEAT])

    def take_outbox(self) -> list[list]:
        outbox, self.outbox = self.outbox, []
        return outbox

    def unroutable(self, identity: bytes) -> None:
        pass


def serve(endpoint: str, idle_ms: float) -> None:
    import asyncio
    import signal

    import uvloop
    import zmq

    from bus.reactor import RouterReactor

    async def main() -> None:
        socket: zmq.Socket = zmq.Context.instance().socket(zmq.ROUTER)
        for option, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.SNDHWM, 100_000), (zmq.RCVHWM, 100_000),
                              (zmq.LINGER, 0)):
            socket.setsockopt(option, value)
        socket.bind(endpoint)
        config = HeartbeatConfig(idle_interval_s=idle_ms / 1000)
        reactor = RouterReactor(socket, LivenessCore(config.idle_interval_s), config.tick_s)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, reactor.stop)
        print("ready", flush=True)
        await reactor.run()
        socket.close(linger=0)

    uvloop.run(main())


def core_cost(num_nodes: int, seconds: float = 2.0) -> dict[str, float]:
    """Percent of one core `BrokerCore.on_frames` and `tick` take for `num_nodes` idle nodes."""
    config = HeartbeatConfig()
    core, now = BrokerCore(config), 1.0
    identities = [b"node-%d" % i for i in range(num_nodes)]
    for i, identity in enumerate(identities):
        core.on_frames(identity, codec.encode(Ready("decode", f"fleet-{i}")), now)
    core.take_outbox()
    core.take_events()
    # Each node once an idle interval (idle links, PROTOCOL.md §1.4).
    num_ticks, per_tick = int(seconds / config.tick_s), max(1, round(num_nodes * config.tick_s / config.idle_interval_s))
    frames_s = tick_s = 0.0
    k = 0
    for _ in range(num_ticks):
        now += config.tick_s
        start = time.perf_counter()
        for _ in range(per_tick):
            core.on_frames(identities[k % num_nodes], [HEARTBEAT], now)
            k += 1
        middle = time.perf_counter()
        core.tick(now)
        core.take_outbox()
        frames_s, tick_s = frames_s + middle - start, tick_s + time.perf_counter() - middle
    assert len(core.nodes_by_id) == num_nodes, "a node expired in the steady state: the feed is wrong"
    simulated = num_ticks * config.tick_s
    return {"on_frames_pct": 100 * frames_s / simulated, "tick_pct": 100 * tick_s / simulated}


if __name__ == "__main__":
    serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1000.0)
