"""A node's connection to the broker: a DEALER socket driven by `EndpointCore` on an asyncio
(uvloop) loop in a dedicated thread, so compute on the node's own threads never delays a
heartbeat (torch and numpy release the GIL; pure Python is preempted every switch interval).

Contract (every method is thread-safe and returns at once unless it says it waits):
- lifecycle: `start()`, `wait_registered(timeout) -> bool`, `stop()`; usable as a context
  manager. `registered` tells whether the broker has acknowledged us right now.
- serving side: `receive(timeout)` / `await receive_async()` return the next `Request`,
  `Direct`, `Control`, `Cancel` or un-scoped `Error`; answer a Request with `reply(...)` (PARTIAL),
  `reply_batch([(request_id, body), ...])` (the next PARTIAL of several streams, one message
  per client: how an engine step's tokens go out), `reply_final(...)` (FINAL) or
  `reply_error(...)` (ERROR). Sequence numbers are ours to keep.
- client side: `request(service, body, payload, key=..., request_id=..., timeout=...)` returns a
  `ReplyStream` (async or blocking iterator, PARTIAL... then FINAL, BusError on ERROR), or
  raises `bus.codec.ProtocolError` (a ValueError) at once when the request cannot travel (ids
  or key over 128 bytes, a body `bus.codec.pack` refuses); `cancel(request_id)`: replies that
  were already on their way are dropped, never queued anywhere.
- `send_direct(node_id, body, payload)` (raises ProtocolError likewise), `update_capacity(mapping)`.
- `send_control(node_id, body)` (a `control` endpoint: a command map to a serving node; raises
  ProtocolError likewise, or for a body over MAX_CONTROL_BYTES); `change_role(role)`: register
  again in another role on the same links (a node switching between prefill and decode).
Timers run every heartbeat interval / 5 while a link carries work or is not registered, every
idle interval / 5 while it is idle (PROTOCOL.md §1.4); work arriving or sent wakes them at once.
`security=SecurityConfig` (optional): the DEALER speaks CURVE to the broker (`server_key`).
Payload items are sent zero-copy (bytes, memoryview, numpy buffers, zmq.Frame); received
payload items are zmq.Frame objects (use `memoryview(frame)` or `frame.bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import uvloop
import zmq

from bus import constants as c
from bus.codec import encode_checked
from bus.endpoint_core import LinkDown, LinkUp
from bus.endpoint_set import EndpointSet
from bus.liveness import HeartbeatConfig
from bus.log import get_logger
from bus.mailbox import Mailbox, ReplyStream, Wakeups
from bus.messages import Control, Direct, Error, Final, Partial, Request
from bus.reactor import has_input
from bus.security import SecurityConfig, apply_client

_BATCH = 256
_HWM = 100_000


class Endpoint:
    def __init__(self, broker_endpoint: str | Sequence[str], role: str, node_id: str | None = None, *,
                 capacity: Mapping[str, float] | None = None, data_endpoint: str = "",
                 heartbeat: HeartbeatConfig | None = None,
                 max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
                 context: zmq.Context | None = None, security: SecurityConfig | None = None) -> None:
        self.brokers = broker_endpoints(broker_endpoint)
        self.broker_endpoint = ",".join(self.brokers)
        self.security = security
        self.node_id = node_id or f"{role}-{uuid.uuid4().hex[:8]}"
        self.role = role
        self.core = EndpointSet(role, self.node_id, len(self.brokers), capacity, data_endpoint, heartbeat)
        self.heartbeat = self.core.heartbeat
        self.max_message_bytes = max_message_bytes
        self.inbox = Mailbox()
        self.log = get_logger("endpoint", node_id=self.node_id, role=role)
        self._context = context or zmq.Context.instance()
        self._streams: dict[str, ReplyStream] = {}
        self._registered = threading.Event()
        self._started = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sockets: list[zmq.Socket | None] = [None] * len(self.brokers)
        self._wake: asyncio.Event | None = None
        self._wait_s = 0.0   # how long the timer loop is waiting now (the link's tick interval)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Endpoint:
        # Pure-Python compute on another thread holds the GIL for a whole switch interval at a
        # time; keep that far below the heartbeat interval (the default 5 ms already is).
        if sys.getswitchinterval() > self.heartbeat.interval_s / 20:
            sys.setswitchinterval(0.005)
            self.log.warning("switch_interval_lowered", seconds=0.005)
        self._thread = threading.Thread(target=self._run, name=f"bus-{self.node_id}", daemon=True)
        self._thread.start()
        self._started.wait()
        return self

    def wait_registered(self, timeout: float | None = None) -> bool:
        return self._registered.wait(timeout)

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    def stop(self, timeout: float = 2.0) -> None:
        """DISCONNECT from the broker, close the socket and end the I/O thread."""
        if self._thread is None or self._loop is None:
            return
        self._stopping = True
        wake = self._wake   # None only before the I/O loop started: it then sees _stopping at once
        with contextlib.suppress(RuntimeError):   # the loop already closed
            if wake is not None:
                self._loop.call_soon_threadsafe(wake.set)
        self._thread.join(timeout)

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving side --------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Request | Direct | Any:
        return self.inbox.get(timeout)

    async def receive_async(self) -> Request | Direct | Any:
        return await self.inbox.get_async()

    def reply(self, request_id: str, body: Any = None, payload: tuple = ()) -> None:
        self._call(self.core.reply, request_id, body, tuple(payload), False)

    def reply_batch(self, items: Sequence[tuple[str, Any]]) -> None:
        """The next PARTIAL of each `(request_id, body)` (no payload), sent as one STREAMS message
        per client: an engine step's tokens cost the broker one message, not one per token."""
        self._call(self.core.reply_batch, list(items))

    def reply_final(self, request_id: str, body: Any = None, payload: tuple = ()) -> None:
        self._call(self.core.reply, request_id, body, tuple(payload), True)

    def reply_error(self, request_id: str, code: str, message: str = "", **details: Any) -> None:
        self._call(self.core.reply_error, request_id, code, message, details)

    # -- client side ---------------------------------------------------------------------

    def request(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
                request_id: str | None = None, timeout: float | None = None) -> ReplyStream:
        request_id = request_id or uuid.uuid4().hex
        frames = encode_checked(Request(service, request_id, body, tuple(payload), "", key))
        stream = ReplyStream(request_id, self.cancel, timeout)
        self._streams[request_id] = stream   # before sending: the reply may come back at once
        self._call(self.core.request_encoded, request_id, frames)
        return stream

    def cancel(self, request_id: str) -> None:
        self._call(self._cancel, request_id)

    def _cancel(self, request_id: str, now: float) -> None:
        # On the I/O thread, in order with the replies: whatever the core delivered before this
        # went to the stream (which its owner dropped), and the core drops whatever comes after.
        self._streams.pop(request_id, None)
        self.core.cancel(request_id, now)

    def send_direct(self, node_id: str, body: Any = None, payload: tuple = ()) -> None:
        self._call(self.core.direct_encoded, encode_checked(Direct(node_id, body, tuple(payload))))

    def send_control(self, node_id: str, body: Mapping[str, Any]) -> None:
        self._call(self.core.control_encoded, encode_checked(Control(node_id, dict(body))))

    def change_role(self, role: str) -> None:
        if role not in c.ROLES:
            raise ValueError(f"role must be one of {c.ROLES}, got {role!r}")
        self.role = role
        self._call(self.core.change_role, role)

    def update_capacity(self, capacity: Mapping[str, float]) -> None:
        self._call(self.core.update_capacity, dict(capacity))

    def metrics(self) -> dict[str, int]:
        return self.core.all_metrics()

    # -- the I/O thread ------------------------------------------------------------------

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


def broker_endpoints(value: str | Sequence[str]) -> list[str]:
    """The brokers of one cluster: a list, or one string of addresses separated by commas."""
    brokers = [part.strip() for part in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value]
    if not brokers or not all(brokers):
        raise ValueError(f"broker endpoints must be non-empty addresses, got {value!r}")
    return brokers
