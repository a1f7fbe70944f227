"""Messages <-> ZeroMQ frames for the control plane; it and `bus.stream_index` are the only
control-plane modules that import msgpack.

Contract:
- `encode(message) -> list` of frames (header first). Payload frames are passed through
  untouched so the caller can send them with copy=False.
- `decode(frames) -> Message` validates everything and raises `ProtocolError(reason, detail,
  request_id)` on malformed, truncated or wrong-version input; never any other exception. Every
  body is within `bus.wire_checks`' bounds (nesting depth, capacity maps, id lists, texts).
- `pack(value)` raises `ProtocolError` (`malformed`) for a value no peer would accept (nested
  deeper than MAX_BODY_DEPTH, ints beyond 64 bits, str that is not UTF-8 encodable, unknown
  types), so `encode` fails in the caller, never on a peer.
- `parse_header(frame) -> Command` is the cheap check the broker's hot path uses, so it can route
  on the header and the routing frames and pass body and payload frames through undecoded.
- The sender's checks on routing frames are `bus.send_checks.encode_checked`'s; the reads of a
  STREAMS index frame (which the broker also makes without decoding) are `bus.stream_index`'s.
Frame layouts (after the ROUTER identity): docs/PROTOCOL.md part 1; `_ENCODERS` and `_DECODERS` below.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack

from bus import constants as c
from bus import wire_checks as checks
from bus.constants import Command
from bus.messages import (
    Adopt,
    Cancel,
    CapacityUpdate,
    Control,
    Direct,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Message,
    Partial,
    Ready,
    Request,
    Streams,
)
from bus.stream_index import stream_index
from bus.wire_checks import ProtocolError

HEADERS: dict[Command, bytes] = {cmd: c.SIGNATURE + bytes((c.VERSION, cmd)) for cmd in Command}
_COMMANDS = {int(cmd): cmd for cmd in Command}
_SEQ = struct.Struct(">Q")
# Minimum number of frames (header included) per command; payload frames may follow the last.
MIN_FRAMES = {Command.READY: 2, Command.HEARTBEAT: 1, Command.DISCONNECT: 2, Command.CAPACITY: 2,
              Command.REQUEST: 6, Command.PARTIAL: 4, Command.FINAL: 4, Command.ERROR: 3,
              Command.DIRECT: 3, Command.CANCEL: 3, Command.STREAMS: 3,
              Command.ADOPT: 2, Command.CONTROL: 3}
_HAS_PAYLOAD = {Command.REQUEST, Command.PARTIAL, Command.FINAL, Command.DIRECT}


def pack(value: Any) -> bytes:
    checks.check_depth(value)
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:   # UnicodeEncodeError is a ValueError
        raise ProtocolError(c.DropReason.MALFORMED, f"body cannot be encoded: {type(exc).__name__}") from None


def unpack(data: Any) -> Any:
    try:
        value = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(c.DropReason.MALFORMED, f"body is not msgpack: {type(exc).__name__}") from None
    return checks.check_depth(value)


def raw_bytes(frame: Any) -> bytes:
    """A frame's bytes (zmq.Frame, memoryview or bytes), copied only when it is not bytes already."""
    return frame if type(frame) is bytes else bytes(frame)


def parse_header(frame: Any) -> Command:
    """The command byte of a header frame, after checking signature and version."""
    header = raw_bytes(frame)
    if len(header) != c.HEADER_SIZE or header[:3] != c.SIGNATURE:
        raise ProtocolError(c.DropReason.MALFORMED, "not a pdbus header")
    if header[3] != c.VERSION:
        raise ProtocolError(c.DropReason.BAD_VERSION, f"version {header[3]}, expected {c.VERSION}")
    command = _COMMANDS.get(header[4])
    if command is None:
        raise ProtocolError(c.DropReason.MALFORMED, f"unknown command 0x{header[4]:02x}")
    return command


def check_frames(command: Command, num_frames: int) -> None:
    if num_frames < MIN_FRAMES[command] or (num_frames > MIN_FRAMES[command]
                                            and command not in _HAS_PAYLOAD):
        raise ProtocolError(c.DropReason.MALFORMED,
                            f"{command.name} with {num_frames} frames, expected {MIN_FRAMES[command]}")


def text(frame: Any, what: str, *, allow_empty: bool = False) -> str:
    """A short utf-8 routing frame (id, service, key) as str, validated."""
    raw = raw_bytes(frame)
    if len(raw) > c.MAX_ID_BYTES or (not raw and not allow_empty):
        raise ProtocolError(c.DropReason.MALFORMED, f"{what} must be 1..{c.MAX_ID_BYTES} bytes")
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError(c.DropReason.MALFORMED, f"{what} is not utf-8") from None


def encode_seq(seq: int) -> bytes:
    return _SEQ.pack(seq)


def decode_seq(frame: Any) -> int:
    raw = bytes(frame)
    if len(raw) != _SEQ.size:
        raise ProtocolError(c.DropReason.MALFORMED, "seq must be 8 bytes")
    return _SEQ.unpack(raw)[0]


def encode(message: Message) -> list[Any]:
    """Frames for `message`, header first; payload frames are appended as given."""
    return _ENCODERS[type(message)](message)


def decode(frames: list[Any]) -> Message:
    """The message in `frames` (header first, no ROUTER identity)."""
    if not frames:
        raise ProtocolError(c.DropReason.MALFORMED, "empty message")
    command = parse_header(frames[0])
    check_frames(command, len(frames))
    return _DECODERS[command](frames)


def _encode_streams(m: Streams) -> list[Any]:
    index: list[Any] = []
    for entry in m.entries:
        if entry.payload:
            raise ProtocolError(c.DropReason.MALFORMED, "a STREAMS entry carries no payload frames")
        index += (entry.request_id.encode(), entry.seq)
    if not 0 < len(m.entries) <= c.MAX_STREAM_ENTRIES:
        raise ProtocolError(c.DropReason.MALFORMED, f"STREAMS carries 1..{c.MAX_STREAM_ENTRIES} entries")
    return [HEADERS[Command.STREAMS], pack(index), pack([entry.body for entry in m.entries])]


def _decode_streams(frames: list[Any]) -> Streams:
    index = stream_index(frames[1])
    bodies = unpack(frames[2])
    if type(bodies) is not list or len(bodies) * 2 != len(index):
        raise ProtocolError(c.DropReason.MALFORMED, "STREAMS bodies must be a list, one per index entry")
    return Streams(tuple(Partial(text(request_id, "request_id"), seq, body)
                         for request_id, seq, body in zip(index[::2], index[1::2], bodies, strict=True)))


def _decode_adopt(body: dict[str, Any]) -> Adopt:
    return Adopt(inflight=checks.id_list(body.get("inflight", []), "inflight"),
                 pending=checks.id_list(body.get("pending", []), "pending"))


def _encode_request(m: Request) -> list[Any]:
    return [HEADERS[Command.REQUEST], m.service.encode(), m.request_id.encode(), m.peer.encode(),
            m.key.encode(), pack(m.body), *m.payload]


def _encode_reply(command: Command, m: Partial | Final) -> list[Any]:
    return [HEADERS[command], m.request_id.encode(), _SEQ.pack(m.seq), pack(m.body), *m.payload]


_ENCODERS = {
    Ready: lambda m: [HEADERS[Command.READY], pack({
        "role": m.role, "node_id": m.node_id, "capacity": dict(m.capacity),
        "data_endpoint": m.data_endpoint, "inflight": list(m.inflight), "pending": list(m.pending)})],
    Heartbeat: lambda m: [HEADERS[Command.HEARTBEAT]],
    Disconnect: lambda m: [HEADERS[Command.DISCONNECT], pack({"reason": m.reason, "detail": m.detail})],
    CapacityUpdate: lambda m: [HEADERS[Command.CAPACITY], pack({"capacity": dict(m.capacity)})],
    Request: _encode_request,
    Partial: lambda m: _encode_reply(Command.PARTIAL, m),
    Final: lambda m: _encode_reply(Command.FINAL, m),
    Streams: _encode_streams,
    Adopt: lambda m: [HEADERS[Command.ADOPT], pack({"inflight": list(m.inflight), "pending": list(m.pending)})],
    Error: lambda m: [HEADERS[Command.ERROR], m.request_id.encode(), pack({
        "code": m.code, "message": m.message, "details": dict(m.details)})],
    Direct: lambda m: [HEADERS[Command.DIRECT], m.peer.encode(), pack(m.body), *m.payload],
    Cancel: lambda m: [HEADERS[Command.CANCEL], m.request_id.encode(), pack({"reason": m.reason})],
    Control: lambda m: [HEADERS[Command.CONTROL], m.peer.encode(), pack(dict(m.body))],
}


def _map(frame: Any, what: str) -> dict[str, Any]:
    value = unpack(frame)
    if not isinstance(value, dict):
        raise ProtocolError(c.DropReason.MALFORMED, f"{what} body must be a map")
    return value


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if not isinstance(value, kind):
        raise ProtocolError(c.DropReason.MALFORMED, f"field {name!r} has the wrong type")
    return value


def capacity_of(value: Any) -> dict[str, float]:
    """A capacity mapping, validated (`bus.wire_checks.capacity_map`)."""
    return checks.capacity_map(value)


def _decode_ready(frames: list[Any]) -> Ready:
    if len(frames[1]) > c.MAX_READY_BYTES:
        raise ProtocolError(c.DropReason.MALFORMED, f"READY body over {c.MAX_READY_BYTES} bytes")
    body = _map(frames[1], "READY")
    role = _field(body, "role", str)
    if role not in c.ROLES:
        raise ProtocolError(c.DropReason.MALFORMED, "unknown role")
    node_id = _field(body, "node_id", str)
    if not 0 < len(node_id.encode(errors="replace")) <= c.MAX_ID_BYTES:
        raise ProtocolError(c.DropReason.MALFORMED, "node_id must be 1..128 bytes")
    data_endpoint = checks.short_str(body.get("data_endpoint", ""), "data_endpoint", c.MAX_ENDPOINT_BYTES)
    return Ready(role=role, node_id=node_id, capacity=capacity_of(body.get("capacity", {})),
                 data_endpoint=data_endpoint, inflight=checks.id_list(body.get("inflight", []), "inflight"),
                 pending=checks.id_list(body.get("pending", []), "pending"))


def _decode_request(frames: list[Any]) -> Request:
    request_id = text(frames[2], "request_id")
    try:
        return Request(service=text(frames[1], "service"), request_id=request_id,
                       peer=text(frames[3], "peer", allow_empty=True),
                       key=text(frames[4], "key", allow_empty=True),
                       body=unpack(frames[5]), payload=tuple(frames[6:]))
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


def _decode_reply(kind: type[Partial] | type[Final], frames: list[Any]) -> Partial | Final:
    request_id = text(frames[1], "request_id")
    try:
        return kind(request_id=request_id, seq=decode_seq(frames[2]), body=unpack(frames[3]),
                    payload=tuple(frames[4:]))
    except ProtocolError as exc:
        exc.request_id = request_id
        raise


def _decode_error(frames: list[Any]) -> Error:
    request_id = text(frames[1], "request_id", allow_empty=True)  # "" = not request-scoped
    try:
        body = _map(frames[2], "ERROR")
        return Error(request_id=request_id, code=checks.short_str(body.get("code"), "code", c.MAX_CODE_BYTES),
                     message=checks.free_text(body.get("message", ""), "message"),
                     details=_field(body, "details", dict, {}))
    except ProtocolError as exc:
        exc.request_id = request_id or None
        raise


def _decode_disconnect(frames: list[Any]) -> Disconnect:
    body = _map(frames[1], "DISCONNECT")
    return Disconnect(reason=checks.short_str(body.get("reason"), "reason", c.MAX_CODE_BYTES),
                      detail=checks.free_text(body.get("detail", ""), "detail"))


def _decode_cancel(frames: list[Any]) -> Cancel:
    request_id = text(frames[1], "request_id")
    try:
        reason = checks.short_str(_map(frames[2], "CANCEL").get("reason", ""), "reason", c.MAX_CODE_BYTES)
    except ProtocolError as exc:
        exc.request_id = request_id
        raise
    return Cancel(request_id=request_id, reason=reason)


def _decode_control(frames: list[Any]) -> Control:
    peer = text(frames[1], "peer")
    if len(frames[2]) > c.MAX_CONTROL_BYTES:
        raise ProtocolError(c.DropReason.MALFORMED, f"CONTROL body over {c.MAX_CONTROL_BYTES} bytes")
    return Control(peer=peer, body=_map(frames[2], "CONTROL"))


_DECODERS: dict[Command, Callable[[list[Any]], Message]] = {
    Command.READY: _decode_ready,
    Command.HEARTBEAT: lambda f: Heartbeat(),
    Command.DISCONNECT: _decode_disconnect,
    Command.CAPACITY: lambda f: CapacityUpdate(capacity=capacity_of(_map(f[1], "CAPACITY").get("capacity"))),
    Command.REQUEST: _decode_request,
    Command.PARTIAL: lambda f: _decode_reply(Partial, f),
    Command.FINAL: lambda f: _decode_reply(Final, f),
    Command.STREAMS: _decode_streams,
    Command.ADOPT: lambda f: _decode_adopt(_map(f[1], "ADOPT")),
    Command.ERROR: _decode_error,
    Command.CANCEL: _decode_cancel,
    Command.DIRECT: lambda f: Direct(peer=text(f[1], "peer"), body=unpack(f[2]), payload=tuple(f[3:])),
    Command.CONTROL: _decode_control,
}
