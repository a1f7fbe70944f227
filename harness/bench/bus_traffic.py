"""The traffic `make bench-bus` drives through a server, and the loops that time it.

Contract: `Peers(context, endpoint, via_relay, security)` opens two DEALER peers, a "client" (`c`)
and a "worker" (`w`), on a bare relay (`via_relay`: fixed routing ids, pinged until both are
in) or on a broker (registered with READY as gateway and decode); `recv` skips the broker's
heartbeats, `keep_alive` heartbeats for peers that only receive, `close` closes both.
Over them, with the same frames whatever the server:
- `round_trips(peers, n)`: microseconds per REQUEST client -> worker -> FINAL -> client, one at a time;
- `open_stream(peers, request_id)`: a request routed to the worker, so the broker forwards its replies;
- `stream_rate(peers, request_id, n, window, payload)`: PARTIALs per second worker -> client with at
  most `window` in flight (`payload`: a raw frame sent zero-copy, for GB/s);
- `endpoint_round_trips(endpoint, n, security)`: microseconds per request through the real API
  (BusClient -> broker -> an Endpoint on a node thread), a broker only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import zmq

from bus import codec
from bus.constants import Command
from bus.messages import Ready

if TYPE_CHECKING:
    from bus.security import SecurityConfig

H = codec.HEADERS


class Peers:
    """The two DEALER peers and the frames they exchange through one kind of server."""

    def __init__(self, context: zmq.Context, endpoint: str, via_relay: bool,
                 security: SecurityConfig | None = None) -> None:
        self.via_relay = via_relay
        self.security = security
        self.client = self._socket(context, endpoint, b"c")
        self.worker = self._socket(context, endpoint, b"w")
        self.last_beat = 0.0
        if via_relay:
            self._wait_connected()
        else:
            self._register()

    def _socket(self, context: zmq.Context, endpoint: str, identity: bytes) -> zmq.Socket:
        socket = context.socket(zmq.DEALER)
        for option, value in ((zmq.SNDHWM, 100_000), (zmq.RCVHWM, 100_000), (zmq.LINGER, 0)):
            socket.setsockopt(option, value)
        if self.via_relay:
            socket.setsockopt(zmq.ROUTING_ID, identity)
        if self.security is not None:
            from bus.security import apply_client
            apply_client(socket, self.security)
        socket.connect(endpoint)
        return socket

    def _wait_connected(self) -> None:
        """The relay drops messages for a peer it has not seen yet: ping until both are in."""
        for sender, receiver in ((self.client, self.worker), (self.worker, self.client)):
            for _ in range(100):
                sender.send_multipart([b"ping"])
                if receiver.poll(100):
                    break
            while receiver.poll(100):
                receiver.recv_multipart()

    def _register(self) -> None:
        self.worker.send_multipart(codec.encode(Ready("decode", "w")))
        self.worker.recv_multipart()   # the broker's HEARTBEAT acknowledges READY
        self.client.send_multipart(codec.encode(Ready("gateway", "c")))
        self.client.recv_multipart()

    def to_worker(self, frames: list) -> list:
        return frames

    def to_client(self, frames: list) -> list:
        return frames

    def recv(self, socket: zmq.Socket) -> list:
        """Next data message (heartbeats from the broker skipped, relay address stripped)."""
        while True:
            if not socket.poll(5000):
                raise RuntimeError("message lost: nothing received for 5 s")
            frames = socket.recv_multipart(copy=False)
            if frames[0].bytes != H[Command.HEARTBEAT]:
                return frames

    def keep_alive(self) -> None:
        """A peer that only receives must still show life to the broker."""
        now = time.monotonic()
        if not self.via_relay and now - self.last_beat > 0.1:
            self.client.send_multipart([H[Command.HEARTBEAT]])
            self.worker.send_multipart([H[Command.HEARTBEAT]])
            self.last_beat = now

    def close(self) -> None:
        self.client.close()
        self.worker.close()


def request_frames(i: int) -> list:
    return [H[Command.REQUEST], b"decode", b"r%d" % i, b"", b"", codec.pack({"tokens": [1, 2, 3]})]


def round_trips(peers: Peers, n: int) -> list[float]:
    """Microseconds per client -> worker -> client round trip."""
    samples = []
    for i in range(n):
        start = time.perf_counter()
        peers.client.send_multipart(peers.to_worker(request_frames(i)))
        request = peers.recv(peers.worker)
        peers.worker.send_multipart(peers.to_client(
            [H[Command.FINAL], request[2], codec.encode_seq(0), request[5]]), copy=False)
        peers.recv(peers.client)
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def open_stream(peers: Peers, request_id: bytes) -> None:
    """The broker only forwards replies to a request it routed: open one first."""
    peers.client.send_multipart(peers.to_worker(
        [H[Command.REQUEST], b"decode", request_id, b"", b"", codec.pack(None)]))
    peers.recv(peers.worker)


def stream_rate(peers: Peers, request_id: bytes, n: int, window: int, payload: object = None) -> float:
    """Messages per second for `n` PARTIALs worker -> client, at most `window` in flight. The
    frames are built once: the servers never look at seq or body, and the driver must be
    cheaper than the server it measures."""
    frames = peers.to_client([H[Command.PARTIAL], request_id, codec.encode_seq(0),
                              codec.pack({"token": 42}), *([payload] if payload is not None else [])])
    send, client = peers.worker.send_multipart, peers.client
    bulk = payload is not None
    sent = received = 0
    start = time.perf_counter()
    while received < n:
        while sent < n and sent - received < window:
            send(frames, copy=not bulk)
            sent += 1
        peers.recv(client)
        received += 1
        while received < sent:
            try:
                client.recv_multipart(zmq.NOBLOCK, copy=not bulk)
            except zmq.Again:
                break
            received += 1   # a stray broker HEARTBEAT may be counted: 1 in thousands
        peers.keep_alive()
    return n / (time.perf_counter() - start)



def endpoint_round_trips(endpoint: str, n: int, security: SecurityConfig | None = None) -> list[float]:
    """Microseconds per request through the real node API: BusClient -> broker -> an Endpoint
    served by a node thread (receive, reply_final) -> back; both I/O threads included."""
    import threading

    from bus.bus_client import BusClient
    from bus.endpoint import Endpoint
    from bus.messages import Request

    worker = Endpoint(endpoint, "decode", "bench-worker", security=security).start()
    client = BusClient(endpoint, "bench-client", security=security).start()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                message = worker.receive(timeout=0.1)
            except TimeoutError:
                continue
            if isinstance(message, Request):
                worker.reply_final(message.request_id, message.body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert worker.wait_registered(10)
        samples = []
        for i in range(n + 100):
            start = time.perf_counter()
            client.call_blocking("decode", {"tokens": [1, 2, 3]}, timeout=10)
            if i >= 100:
                samples.append((time.perf_counter() - start) * 1e6)
        return samples
    finally:
        stop.set()
        thread.join()
        client.close()
        worker.stop()

