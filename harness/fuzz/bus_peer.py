"""Control-plane senders: hostile traffic at the broker's ROUTER (docs/PROTOCOL.md part 1), from
unregistered sockets and from inside registered sessions (plain mode, no CURVE).

Contract:
- `Counts` (a Counter): `sent.<target>.<kind>` per message sent, `seen.<target>.<kind>` per message
  received, `blocked.<target>` for sends that found the socket's queue full for a whole second.
- `await garbage_burst(context, endpoint, messages, counts)`: a fresh DEALER (a new peer nobody
  registered) sends each `(kind, frames)`, reads the answers for a moment, and closes.
- `Session(context, endpoint, role, node_id, counts, capacity=, data_endpoint=)`: a registered peer.
  `await start()` sends READY and waits for the broker's HEARTBEAT (the acknowledgement); then a
  task heartbeats every 100 ms and reads everything: a DISCONNECT (the broker cuts a registered peer
  that sent garbage, §1.7) is answered with READY at once, a REQUEST routed to it lands in
  `requests` (an asyncio.Queue of `bus.messages.Request`) for a hostile node to answer, anything else
  is counted. `await send(kind, frames)` sends from inside the session; `await close()` says
  DISCONNECT and closes, so the broker cancels and fails what the session had in flight.
Every socket has LINGER 0; every send and wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import zmq
import zmq.asyncio

from bus import codec
from bus.codec import ProtocolError
from bus.constants import Command
from bus.messages import Disconnect, Heartbeat, Ready, Request

SEND_TIMEOUT_S = 1.0
HEARTBEAT_S = 0.1


class Counts(Counter):
    """Messages sent and seen per target and kind."""


def new_dealer(context: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 1000)
    socket.connect(endpoint)
    return socket


async def send(socket: zmq.asyncio.Socket, frames: list[bytes], counts: Counts, label: str) -> bool:
    try:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await socket.send_multipart(frames or [b""], copy=False)
    except TimeoutError:
        counts[f"blocked.{label.split('.')[0]}"] += 1
        return False
    counts[f"sent.{label}"] += 1
    return True


def kind_of(frames: list) -> str:
    try:
        return codec.parse_header(frames[0]).name
    except (ProtocolError, IndexError):
        return "undecodable"


async def drain(socket: zmq.asyncio.Socket, counts: Counts, target: str, seconds: float) -> None:
    """Count what arrives on `socket` within `seconds`."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                counts[f"seen.{target}.{kind_of(await socket.recv_multipart())}"] += 1


async def garbage_burst(context: zmq.asyncio.Context, endpoint: str, messages: list[tuple[str, list[bytes]]],
                        counts: Counts) -> None:
    socket = new_dealer(context, endpoint)
    try:
        for kind, frames in messages:
            await send(socket, frames, counts, f"broker.{kind}")
        await drain(socket, counts, "broker", 0.05)
    finally:
        socket.close(linger=0)


class Session:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str, role: str, node_id: str, counts: Counts, *,
                 capacity: dict | None = None, data_endpoint: str = "") -> None:
        self.context, self.endpoint, self.counts = context, endpoint, counts
        self.ready = Ready(role, node_id, dict(capacity or {}), data_endpoint)
        self.label = f"session.{role}"
        self.requests: asyncio.Queue[Request] = asyncio.Queue(maxsize=256)
        self.socket: zmq.asyncio.Socket | None = None
        self.registered = asyncio.Event()
        self.num_registrations = 0
        self._task: asyncio.Task | None = None

    @property
    def node_id(self) -> str:
        return self.ready.node_id

    @property
    def dealer(self) -> zmq.asyncio.Socket:
        """The session's socket, which `start()` opened."""
        assert self.socket is not None, "start() the session first"
        return self.socket

    async def start(self, timeout: float = 5.0) -> bool:
        self.socket = new_dealer(self.context, self.endpoint)
        await self._register()
        self._task = asyncio.create_task(self._run())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.registered.wait()
        return self.registered.is_set()

    async def _register(self) -> None:
        self.registered.clear()
        await self.dealer.send_multipart(codec.encode(self.ready))

    async def send(self, kind: str, frames: list[bytes]) -> bool:
        return await send(self.dealer, frames, self.counts, f"{self.label}.{kind}")

    async def _run(self) -> None:
        beat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                frames = await self.dealer.recv_multipart()
                kind = kind_of(frames)
                self.counts[f"seen.{self.label}.{kind}"] += 1
                if kind == "DISCONNECT":
                    await self._register()
                elif kind == "HEARTBEAT" and not self.registered.is_set():
                    self.num_registrations += 1
                    self.registered.set()
                elif kind == "REQUEST":
                    self._take_request(frames)
        finally:
            beat.cancel()

    def _take_request(self, frames: list) -> None:
        with contextlib.suppress(ProtocolError, asyncio.QueueFull):
            request = codec.decode(frames)
            if isinstance(request, Request):
                self.requests.put_nowait(request)

    async def _heartbeat(self) -> None:
        heartbeat = codec.encode(Heartbeat())
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    await self.dealer.send_multipart(heartbeat)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                await self._task
        if self.socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.socket.send_multipart(codec.encode(Disconnect("shutdown", "fuzz session over")), zmq.NOBLOCK)
            await asyncio.sleep(0.05)   # LINGER 0: give the DISCONNECT a moment to leave
            self.socket.close(linger=0)


def reply_frames(command: Command, request_id: str, seq: int, body: bytes) -> list[bytes]:
    """A reply's frames with a given body (bytes, possibly not msgpack at all)."""
    if command is Command.ERROR:
        return [codec.HEADERS[command], request_id.encode(), body]
    return [codec.HEADERS[command], request_id.encode(), codec.encode_seq(seq), body]
