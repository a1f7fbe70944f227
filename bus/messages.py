"""One frozen, slotted dataclass per control-plane wire message (see docs/PROTOCOL.md part 1).

Contract: these are plain values; `bus.codec` turns them into frames and back. `body` is any
msgpack-serialisable value; `payload` is a tuple of raw binary frames (bytes, memoryview or
zmq.Frame) that travel as their own ZeroMQ frames, never inside msgpack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Payload = tuple[Any, ...]   # bytes | memoryview | zmq.Frame, kept zero-copy


@dataclass(frozen=True, slots=True)
class Ready:
    """Node -> broker: register (or re-register) with role, capacity and in-flight requests."""

    role: str
    node_id: str
    capacity: Mapping[str, float] = field(default_factory=dict)
    data_endpoint: str = ""
    inflight: tuple[str, ...] = ()   # requests this node is serving now
    pending: tuple[str, ...] = ()    # requests this node sent and still awaits replies for


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Either way: I am alive (sent only when the link is otherwise idle)."""


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Either way: the sender drops the session; `reason` is a DisconnectReason value."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class CapacityUpdate:
    """Node -> broker: the node's capacity changed (replaces the whole capacity mapping)."""

    capacity: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Request:
    """Client -> broker -> serving node. `peer` is empty when sent and is the sender's node id
    when delivered; `key` is an opaque routing key (e.g. a session id) for the routing policy."""

    service: str
    request_id: str
    body: Any = None
    payload: Payload = ()
    peer: str = ""
    key: str = ""


@dataclass(frozen=True, slots=True)
class Partial:
    """Serving node -> broker -> client: one message of a reply stream; `seq` counts from 0."""

    request_id: str
    seq: int
    body: Any = None
    payload: Payload = ()


@dataclass(frozen=True, slots=True)
class Final:
    """Serving node -> broker -> client: the last message of a reply stream."""

    request_id: str
    seq: int
    body: Any = None
    payload: Payload = ()


@dataclass(frozen=True, slots=True)
class Streams:
    """Serving node -> broker -> client: the next PARTIAL of several streams at once (one engine
    step's tokens for one client), delivered to node code as the `Partial`s it carries. Entries
    carry no payload frames."""

    entries: tuple[Partial, ...]


@dataclass(frozen=True, slots=True)
class Error:
    """Request-scoped failure, from the serving node or the broker; ends the reply stream."""

    request_id: str
    code: str
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Direct:
    """Node -> broker -> node `peer`; delivered with `peer` set to the sender's node id."""

    peer: str
    body: Any = None
    payload: Payload = ()


@dataclass(frozen=True, slots=True)
class Control:
    """`control` peer -> broker -> serving node `peer`; delivered with `peer` set to the sender's
    node id. `body` is a map (a command: bounded by MAX_CONTROL_BYTES; nodes/wire reads it)."""

    peer: str
    body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cancel:
    """Client -> broker -> serving node (or broker -> serving node when the client died)."""

    request_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Adopt:
    """Node -> broker: requests this registered node moved here from a broker it lost: those it
    serves (`inflight`) and those it awaits replies for (`pending`), as READY announces them."""

    inflight: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()


Message = (Ready | Heartbeat | Disconnect | CapacityUpdate | Request | Partial | Final | Streams
           | Error | Direct | Control | Cancel | Adopt)
