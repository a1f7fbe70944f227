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
The I/O thread itself (sockets, timers, dispatching events) is `bus.endpoint_loop`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import zmq

from bus import constants as c
from bus.endpoint_loop import EndpointLoop
from bus.endpoint_set import EndpointSet
from bus.liveness import HeartbeatConfig
from bus.log import get_logger
from bus.mailbox import Mailbox, ReplyStream
from bus.messages import Control, Direct, Request
from bus.security import SecurityConfig
from bus.send_checks import encode_checked


class Endpoint(EndpointLoop):
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


def broker_endpoints(value: str | Sequence[str]) -> list[str]:
    """The brokers of one cluster: a list, or one string of addresses separated by commas."""
    brokers = [part.strip() for part in value.split(",")] if isinstance(value, str) else [str(v).strip() for v in value]
    if not brokers or not all(brokers):
        raise ValueError(f"broker endpoints must be non-empty addresses, got {value!r}")
    return brokers
