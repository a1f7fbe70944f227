"""A swarm of simulated idle decode nodes for `fleet_bench`: many DEALER sockets in one process,
each one a node as docs/PROTOCOL.md §1.3–1.4 describes it, and nothing more.

Contract: `python -m harness.bench.fleet_swarm ENDPOINT --first I --count N [--interval-ms 250]
[--idle-interval-ms 1000] [--liveness 3] [--capacity-hz R] [--window W]`
- Opens N DEALER sockets on one ZeroMQ context; node `fleet-<i>` (i from I) registers with READY as
  a `decode` node with a real decode node's capacity map, at most W READYs awaiting their answer
  at once (patiently: `Swarm.register_all`); the first message from the broker acknowledges it.
- Registered nodes then behave as idle nodes (no request: §1.4's idle link): they answer nothing;
  each sends a HEARTBEAT when it has sent nothing for one idle interval (or, at R per second per
  node, a CAPACITY instead, which also counts as traffic); any message from the broker is life. As
  §1.6 says of an endpoint, a node that gets a DISCONNECT or hears nothing for idle interval x
  liveness drops its socket (and whatever is
  queued on it), opens a fresh one and sends READY (the first retry at once, then a jittered,
  doubling back-off; each socket held one liveness window), and sends nothing else until the
  broker acknowledges it. `links_lost`, `disconnects` and `reconnects` count that churn.
- stdout, one JSON object a line: `{"event": "registered", ...}` once every node is registered (or
  the registration timed out: the count says how many), then the cumulative `Counters` for every
  `stats` line read on stdin; `stop` (or EOF) ends the process after one last counters line.
Cheap on purpose, to leave the cores to the broker: nodes are visited from a heap by due time, each
every idle interval plus a random part of a timer tick (interval / 5: a real endpoint's timers run
every tick): one EVENTS read, the receives waiting,
one send; no poller over all sockets. `worst_send_gap_s` says how late the swarm itself ran.
"""

from __future__ import annotations

import argparse
import faulthandler
import heapq
import itertools
import json
import random
import resource
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass

import zmq

from bus import codec
from bus.constants import Command
from bus.liveness import Backoff, HeartbeatConfig
from bus.messages import CapacityUpdate, Ready
from bus.reactor import has_input

HEARTBEAT = codec.HEADERS[Command.HEARTBEAT]
DISCONNECT = codec.HEADERS[Command.DISCONNECT]
# What an idle decode node reports (nodes/decode_node.py `capacity`), so READY and CAPACITY bodies
# have the real size.
CAPACITY = {"kv_blocks_total": 4096, "kv_blocks_free": 4096, "kv_blocks_cached": 0, "block_size": 16,
            "kv_mib_cached": 0.0, "kv_mib_slots": 0.0, "kv_mib_buffers": 64.0, "max_running": 32,
            "num_running": 0, "full": 0, "kv_imported_tokens": 0, "prefix_reused_tokens": 0}


@dataclass
class Counters:
    registered: int = 0          # nodes registered now
    acknowledged: int = 0        # READYs the broker acknowledged (re-registrations included)
    sent_ready: int = 0
    sent_heartbeat: int = 0
    sent_capacity: int = 0
    send_blocked: int = 0        # a send that found the socket's queue full (EAGAIN)
    received: int = 0            # any message from the broker
    disconnects: int = 0         # DISCONNECTs received (e.g. `not_registered` after an expiry)
    links_lost: int = 0          # registered nodes that lost the broker: a DISCONNECT or its silence
    broker_silences: int = 0     # of those, the broker's silence for interval x liveness
    reconnects: int = 0          # fresh sockets opened to register again
    reconnects_failed: int = 0   # no socket to be had at that moment (retried an interval later)
    worst_send_gap_s: float = 0.0


class SimNode:
    __slots__ = ("node_id", "socket", "registered", "last_sent", "last_heard", "retry_at", "backoff", "credit")

    def __init__(self, node_id: str, socket: zmq.Socket, now: float, backoff: Backoff) -> None:
        self.node_id, self.socket = node_id, socket
        self.registered = False
        self.last_sent = self.last_heard = self.retry_at = now
        self.backoff = backoff
        self.credit = random.random()   # spreads the nodes' CAPACITY reports over time


class Swarm:
    def __init__(self, endpoint: str, first: int, count: int, config: HeartbeatConfig,
                 capacity_hz: float, window: int, fd_limit: int) -> None:
        self.endpoint, self.first, self.count, self.window = endpoint, first, count, window
        self.config = config
        self.capacity_per_visit = capacity_hz * config.idle_interval_s   # at most one report a visit
        self.context = zmq.Context(io_threads=1)
        # Room for the sockets a reconnecting fleet has closed and libzmq has not yet reaped, as far
        # as descriptors allow (two a socket).
        self.context.set(zmq.MAX_SOCKETS, max(count + 64, min(3 * count, fd_limit // 2 - 64)))
        self.counters = Counters()
        self.nodes: list[SimNode] = []
        self.due: list[tuple[float, int, SimNode]] = []   # a heap of (due time, tie-break, node)
        self._tie = itertools.count()
        self.stopping = threading.Event()

    # -- registration --------------------------------------------------------------------

    def register_all(self, timeout_s: float) -> None:
        """Open and register every node, W at a time; registered nodes keep heartbeating meanwhile.
        Patient where a node is not: a READY waits for its answer until the deadline instead of
        being sent again on a fresh socket after one liveness window (§1.6), so that a broker slow
        to accept thousands of connections is not also handed their reconnects; what is still
        unanswered at the deadline goes to the schedule, which retries it as a node would."""
        pending: dict[zmq.Socket, SimNode] = {}
        poller = zmq.Poller()
        deadline = time.monotonic() + timeout_s
        num_opened = 0
        while self.counters.registered < self.count and time.monotonic() < deadline:
            while len(pending) < self.window and num_opened < self.count:
                try:
                    socket = self._connect()
                except zmq.ZMQError:   # out of sockets while closed ones are reaped: next round
                    break
                node = SimNode(f"fleet-{self.first + num_opened}", socket, time.monotonic(),
                               Backoff(self.config.interval_s, self.config.backoff_cap_s))
                self._send_ready(node, time.monotonic())
                pending[node.socket] = node
                poller.register(node.socket, zmq.POLLIN)
                num_opened += 1
            for socket, _ in poller.poll(self._ms_to_next_due()):
                node = pending.pop(socket)
                poller.unregister(socket)
                self._drain(node, time.monotonic())
                self._schedule(node)
            self.visit_due(time.monotonic())
        for socket, node in pending.items():   # timed out: the schedule retries them
            poller.unregister(socket)
            node.retry_at = time.monotonic()
            self._schedule(node)

    def _connect(self) -> zmq.Socket:
        socket = self.context.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 1000), (zmq.RCVHWM, 1000)):
            socket.setsockopt(option, value)
        socket.connect(self.endpoint)
        return socket

    def _send_ready(self, node: SimNode, now: float) -> None:
        ready = Ready("decode", node.node_id, capacity=CAPACITY, data_endpoint="tcp://127.0.0.1:1")
        node.socket.send_multipart(codec.encode(ready))
        node.last_sent = node.last_heard = now
        # Hold this socket one liveness window, or the back-off if longer, before trying another
        # (§1.6; bus.endpoint_core `on_socket_opened`).
        node.retry_at = now + max(self.config.expiry_s, node.backoff.next_delay())
        self.counters.sent_ready += 1

    def _schedule(self, node: SimNode) -> None:
        self.nodes.append(node)
        # A random first visit spreads the nodes' heartbeats over the interval.
        due = time.monotonic() + random.uniform(0, self.config.idle_interval_s)
        heapq.heappush(self.due, (due, next(self._tie), node))

    # -- steady state --------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping.is_set():
            time.sleep(self._ms_to_next_due() / 1000)
            self.visit_due(time.monotonic())

    def _ms_to_next_due(self) -> int:
        if not self.due:
            return 50
        return max(0, min(50, int((self.due[0][0] - time.monotonic()) * 1000) + 1))

    def visit_due(self, now: float) -> None:
        due, interval, tick = self.due, self.config.idle_interval_s, self.config.tick_s
        while due and due[0][0] <= now:
            at, tie, node = due[0]
            self._visit(node, now)
            # As a real endpoint: due after one idle interval, seen at its next timer tick.
            # Fallen behind by a whole interval: restart the schedule rather than send a burst.
            base = at if now - at < interval else now
            heapq.heapreplace(due, (base + interval + random.uniform(0, tick), tie, node))

    def _visit(self, node: SimNode, now: float) -> None:
        self._drain(node, now)
        if not node.registered:
            if now >= node.retry_at:
                self._reconnect(node, now)
            return
        if now - node.last_heard > self.config.idle_expiry_s:
            self.counters.broker_silences += 1
            self._link_lost(node, now)
            return
        gap = now - node.last_sent
        self.counters.worst_send_gap_s = max(self.counters.worst_send_gap_s, gap)
        node.credit += self.capacity_per_visit
        try:
            if node.credit >= 1:
                node.credit -= 1
                update = CapacityUpdate({**CAPACITY, "kv_blocks_free": random.randrange(4096)})
                node.socket.send_multipart(codec.encode(update), zmq.NOBLOCK)
                self.counters.sent_capacity += 1
            else:
                node.socket.send(HEARTBEAT, zmq.NOBLOCK)
                self.counters.sent_heartbeat += 1
        except zmq.Again:
            self.counters.send_blocked += 1
        node.last_sent = now

    def _drain(self, node: SimNode, now: float) -> None:
        socket = node.socket
        # EVENTS before each receive: cheaper than the zmq.Again of an empty NOBLOCK receive.
        while has_input(socket):
            frames = socket.recv_multipart(zmq.NOBLOCK)
            self.counters.received += 1
            node.last_heard = now
            if frames[0] == DISCONNECT:
                self.counters.disconnects += 1
                if node.registered:
                    self._link_lost(node, now)
                return   # what else is queued goes with the socket
            if not node.registered:   # the first message after READY acknowledges it
                node.registered = True
                node.backoff.reset()
                self.counters.registered += 1
                self.counters.acknowledged += 1

    def _link_lost(self, node: SimNode, now: float) -> None:
        """As an endpoint: the first retry at once, on a fresh socket; repeated ones back off."""
        node.registered = False
        node.retry_at = now
        self.counters.registered -= 1
        self.counters.links_lost += 1

    def _reconnect(self, node: SimNode, now: float) -> None:
        try:
            socket = self._connect()
        except zmq.ZMQError:   # out of sockets or descriptors while closed ones are reaped: later
            node.retry_at = now + self.config.interval_s
            self.counters.reconnects_failed += 1
            return
        node.socket.close(linger=0)
        node.socket = socket
        self.counters.reconnects += 1
        self._send_ready(node, now)

    def close(self) -> None:
        for node in self.nodes:
            node.socket.close(linger=0)
        self.context.term()


def _emit(payload: dict) -> None:
    try:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:   # the controller is gone (it gave up on us): nobody to tell
        pass


def _serve_stdin(swarm: Swarm) -> None:
    """The controller's commands: `stats` (print the counters) and `stop` (or EOF)."""
    for line in sys.stdin:
        if line.strip() == "stats":
            _emit(asdict(swarm.counters))
        elif line.strip() == "stop":
            break
    swarm.stopping.set()


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (each socket takes two descriptors); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--interval-ms", type=float, default=250.0)
    parser.add_argument("--idle-interval-ms", type=float, default=1000.0)
    parser.add_argument("--liveness", type=int, default=3)
    parser.add_argument("--capacity-hz", type=float, default=0.0)
    parser.add_argument("--window", type=int, default=64, help="READYs awaiting acknowledgement at once")
    parser.add_argument("--register-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)   # `kill -USR1 <pid>`: where a stuck swarm is
    fd_limit = raise_fd_limit()
    config = HeartbeatConfig(interval_s=args.interval_ms / 1000, liveness=args.liveness,
                             idle_interval_s=args.idle_interval_ms / 1000)
    swarm = Swarm(args.endpoint, args.first, args.count, config, args.capacity_hz, args.window, fd_limit)
    started = time.monotonic()
    swarm.register_all(args.register_timeout)
    _emit({"event": "registered", "registered": swarm.counters.registered, "wanted": args.count,
           "seconds": round(time.monotonic() - started, 3), "fd_limit": fd_limit})
    threading.Thread(target=_serve_stdin, args=(swarm,), daemon=True).start()
    swarm.run()
    _emit(asdict(swarm.counters))
    swarm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
