"""The asyncio (uvloop) driver of a ROUTER socket around a sans-I/O core.

Contract: `RouterReactor(socket, core, tick_s)` with a core offering `on_frames(identity, frames,
now)`, `tick(now)`, `take_outbox() -> [[identity, *frames], ...]` and `unroutable(identity)`;
a core that also offers `peer_gone(identity, now)` hears which undeliverable peers have no
connection any more (EHOSTUNREACH, as opposed to a full queue).
`await run()` serves until `stop()`. Incoming messages are drained in batches with NOBLOCK
receives (zero-copy frames) on socket readability; outgoing messages are sent zero-copy right
after each batch; `core.tick` runs every `tick_s`, always after draining what has arrived, so a
broker that was itself stalled judges liveness on the messages waiting for it, not on its own
delay. The same reactor drives the broker and the benchmark's bare relay, so their difference
is the protocol logic alone.
`queued_messages(socket, limit, copy)` yields the messages already queued on a synchronous socket
(at most `limit`) without blocking: the KV data plane's sender and receiver take what arrived
between two awaits with it. `has_input(socket)`: a message is queued on it (zmq.EVENTS).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

_BATCH = 512


def has_input(socket: zmq.Socket) -> bool:
    """Whether a message is queued on `socket`. Re-read after sending: a send can consume the
    edge-triggered FD's read notification."""
    events = socket.get(zmq.EVENTS)   # an int; pyzmq types every option `int | bytes`
    return isinstance(events, int) and bool(events & zmq.POLLIN)


def queued_messages(socket: zmq.Socket, limit: int | None = None, copy: bool = True) -> Iterator[list]:
    """The messages already queued on `socket`, at most `limit` (None: all of them), received
    NOBLOCK. EVENTS is read before each receive: a getsockopt is cheaper than the zmq.Again a
    NOBLOCK receive raises when nothing is there, which is most times a caller looks."""
    for _ in itertools.repeat(None) if limit is None else range(limit):
        if not has_input(socket):
            return
        try:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return
        yield frames


class RouterReactor:
    def __init__(self, socket: zmq.Socket, core: Any, tick_s: float,
                 after_batch: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.core = core
        self.tick_s = tick_s
        self.after_batch = after_batch or (lambda: None)
        self.clock = clock
        self._stop = asyncio.Event()

    async def run(self) -> None:
        """Serve until `stop()`; `drain` and `flush` run on this coroutine's loop."""
        loop = asyncio.get_running_loop()
        fd = self.socket.fileno()   # zmq.FD: edge-triggered
        loop.add_reader(fd, self.drain)
        self.drain()
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.tick_s)
                self.drain()
                self.core.tick(self.clock())
                self.flush()
        finally:
            loop.remove_reader(fd)

    def stop(self) -> None:
        self._stop.set()

    def drain(self) -> None:
        socket, on_frames = self.socket, self.core.on_frames
        now = self.clock()
        for _ in range(_BATCH):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            on_frames(frames[0].bytes, frames[1:], now)
        else:
            asyncio.get_running_loop().call_soon(self.drain)   # more waiting: let the timer run in between
        self.flush()

    def flush(self) -> None:
        outbox = self.core.take_outbox()
        if not outbox:
            self.after_batch()
            return
        socket, peer_gone = self.socket, getattr(self.core, "peer_gone", None)
        for frames in outbox:
            try:
                socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as exc:   # EHOSTUNREACH (peer gone) or EAGAIN (its queue is full)
                self.core.unroutable(frames[0])
                if exc.errno == zmq.EHOSTUNREACH and peer_gone is not None:
                    peer_gone(frames[0], self.clock())
        self.after_batch()
        # A send can consume the edge-triggered read notification: look again.
        if has_input(socket):
            asyncio.get_running_loop().call_soon(self.drain)
