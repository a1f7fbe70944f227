"""The I/O thread of a `bus.endpoint.Endpoint`: the asyncio (uvloop) loop that drives its
`EndpointSet` over one DEALER socket per broker. A base of `Endpoint`, sharing its state.

Contract:
- `_call(method, *args)` (any thread; the endpoint must be started) runs `method(*args, now)` on
  the I/O thread, then sends what it queued; an exception there is logged (never the call's
  arguments) and counted as `failed.call`, never raised in the caller.
- `_run()` is the thread's body: it opens every broker's socket (`max_message_bytes`, CURVE when
  `security` is set), sets `_started`, then until `_stopping` runs the core's timers every
  `tick_interval()` (or at once when `_wake` is set), opening a fresh socket for each link the
  core gives up on; on the way out the core says goodbye and the sockets close (200 ms linger).
- Each socket is drained whenever it is readable (at most _BATCH messages a turn, the rest after
  timers and calls). After each drain and timer run the core's events are dispatched: replies
  to their `ReplyStream`, a reply of a cancelled stream dropped (`dropped.late_reply`),
  `LinkUp` / `LinkDown` to `registered`, anything else to the inbox; after every turn, calls
  too, its outbox is sent (a full send queue drops and counts `dropped.send_queue_full`).
- `tick.max_gap_ms` is the longest gap seen between timer runs (what the liveness window had left).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import structlog
import uvloop
import zmq

from bus.endpoint_core import LinkDown, LinkUp
from bus.endpoint_set import EndpointSet
from bus.liveness import HeartbeatConfig
from bus.mailbox import Mailbox, ReplyStream, Wakeups
from bus.messages import Error, Final, Partial
from bus.reactor import has_input
from bus.security import SecurityConfig, apply_client

_BATCH = 256
_HWM = 100_000


class EndpointLoop:
    brokers: list[str]
    broker_endpoint: str
    security: SecurityConfig | None
    core: EndpointSet
    heartbeat: HeartbeatConfig
    max_message_bytes: int
    inbox: Mailbox
    log: structlog.typing.FilteringBoundLogger
    _context: zmq.Context
    _streams: dict[str, ReplyStream]
    _registered: threading.Event
    _started: threading.Event
    _stopping: bool
    _loop: asyncio.AbstractEventLoop | None
    _sockets: list[zmq.Socket | None]
    _wake: asyncio.Event | None
    _wait_s: float

    def _call(self, method: Any, *args: Any) -> None:
        """Run `method(*args, now)` on the I/O thread, then send what it queued."""
        if self._loop is None:
            raise RuntimeError("endpoint not started")
        self._loop.call_soon_threadsafe(self._apply, method, args)

    def _apply(self, method: Any, args: tuple) -> None:
        try:
            method(*args, time.monotonic())
        except Exception as exc:   # node code's call, not the link: log it (never its arguments)
            self.core.metrics["failed.call"] += 1
            self.log.error("endpoint_call_failed", call=getattr(method, "__name__", "?"),
                           error=type(exc).__name__)
        self._flush()
        self._wake_if_engaged()

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        for index in range(len(self.brokers)):
            self._open_socket(index)
        self._started.set()
        last_tick = time.monotonic()
        while not self._stopping:
            self._wait_s = self.core.tick_interval()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._wait_s)
            if not self._stopping:
                self._wake.clear()
            now = time.monotonic()
            # The longest gap between timer runs (the planned wait included, GIL or CPU starvation on
            # top): held against the liveness window, the margin heartbeats had left.
            gap_ms = int((now - last_tick) * 1000)
            self.core.metrics["tick.max_gap_ms"] = max(self.core.metrics["tick.max_gap_ms"], gap_ms)
            last_tick = now
            for index in range(len(self.brokers)):
                self._drain(index)   # read what arrived before judging a broker silent
            for index in self.core.tick(time.monotonic()):
                if not self._stopping:
                    self._open_socket(index)
            self._dispatch()
            self._flush()
        self.core.close(time.monotonic())
        self._flush()
        for index in range(len(self.brokers)):
            self._close_socket(index, linger_ms=200)

    def _open_socket(self, index: int) -> None:
        self._close_socket(index, linger_ms=0)   # drop whatever the lost session still had queued
        socket = self._context.socket(zmq.DEALER)
        for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, _HWM), (zmq.RCVHWM, _HWM),
                              (zmq.RECONNECT_IVL, 100), (zmq.MAXMSGSIZE, self.max_message_bytes)):
            socket.setsockopt(option, value)
        if self.security is not None:
            apply_client(socket, self.security)
        socket.connect(self.brokers[index])
        self._sockets[index] = socket
        # zmq.FD is edge-triggered: drain on every notification
        asyncio.get_running_loop().add_reader(socket.fileno(), self._drain, index)
        self.core.on_socket_opened(index, time.monotonic())
        self._flush()

    def _close_socket(self, index: int, linger_ms: int) -> None:
        socket = self._sockets[index]
        if socket is None:
            return
        asyncio.get_running_loop().remove_reader(socket.fileno())
        socket.close(linger=linger_ms)
        self._sockets[index] = None

    def _drain(self, index: int) -> None:
        socket = self._sockets[index]
        if socket is None:
            return
        now = time.monotonic()
        for _ in range(_BATCH):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.core.on_frames(index, frames, now)
        else:
            asyncio.get_running_loop().call_soon(self._drain, index)   # more waiting: timers and calls first
        self._dispatch()
        self._flush()
        self._wake_if_engaged()

    def _wake_if_engaged(self) -> None:
        """An idle link's timers run 5x less often; work that just arrived (or was sent) makes
        the timer loop take up the short tick at once."""
        # A float compare first: a link with work already ticks fast (the hot path stops here).
        if (self._wait_s > self.heartbeat.tick_s and self._wake is not None
                and self._wait_s > self.core.tick_interval()):
            self._wake.set()

    def _flush(self) -> None:
        outbox = self.core.take_outbox()
        loop = asyncio.get_running_loop()
        for index, frames in outbox:
            socket = self._sockets[index]
            if socket is None:
                continue
            try:
                socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.core.metrics["dropped.send_queue_full"] += 1
        # A send can consume the edge-triggered read notification: look again.
        for index in {index for index, _ in outbox}:
            socket = self._sockets[index]
            if socket is not None and has_input(socket):
                loop.call_soon(self._drain, index)

    def _dispatch(self) -> None:
        wakeups = Wakeups()   # one cross-thread wake-up per loop for a burst (a STREAMS message)
        for event in self.core.take_events():
            stream = (self._streams.get(event.request_id)
                      if isinstance(event, Partial | Final | Error) else None)
            if stream is not None:   # (node code may cancel it concurrently: no KeyError here)
                if not isinstance(event, Partial):
                    self._streams.pop(event.request_id, None)
                stream.mailbox.put(event, wakeups)
            elif isinstance(event, Partial | Final):   # its stream was cancelled: nobody reads it
                self.core.metrics["dropped.late_reply"] += 1
            elif isinstance(event, LinkUp):
                self._registered.set()
                self.log.info("registered", broker=self.broker_endpoint)
            elif isinstance(event, LinkDown):
                self._registered.clear()
                self.log.warning("broker_lost", reason=event.reason)
            else:
                self.inbox.put(event)
        wakeups.send()
