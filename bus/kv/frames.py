"""KV data-plane messages and their wire form; the only KV module that touches msgpack.

Every message is a multipart ZeroMQ message whose first frame is the header frame:

    b"PDKV" | version (1 byte) | kind (1 byte) | msgpack array of fields | xxh3_64 (8 bytes, LE)

The trailing xxh3_64 covers everything before it, so a flipped bit anywhere in a header is caught
before a field is trusted. CHUNK messages carry their payload as further frames (sent with
copy=False); the others are header-only. `encode_message` / `decode_message` convert between the
frozen dataclasses below and frames; `decode_message` validates every field (bus/kv/header_checks.py:
types, ranges, consistency with the transfer's shape, all before anything is built) and raises only
KVFrameError. docs/PROTOCOL.md part 2 is the normative description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from bus.kv import header_checks as checks
from bus.kv.kv_errors import KVFrameError
from bus.kv.layout import ChunkSpec, KVInfo

MAGIC = b"PDKV"
VERSION = 2   # 2: raw and bf16 payloads travel as frames of whole planes (layout.frame_specs)
CHUNK, END, ABORT, ACK, NACK, DONE = 1, 2, 3, 17, 18, 19
_PREFIX = len(MAGIC) + 2
_TRAILER = 8


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """How one payload frame travels: codec, byte-shuffle element size, raw and wire lengths."""

    codec: str
    shuffle: int
    raw_len: int
    wire_len: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """sender -> receiver: one chunk; its header repeats the whole transfer's description."""

    transfer_id: str
    request_id: str
    shape: tuple[int, ...]
    dtype: str
    mode: str
    token_offset: int        # position of token 0 of this KV in the request's sequence
    num_chunks: int
    index: int
    plane_start: int
    plane_stop: int
    token_start: int
    token_stop: int
    scale_dtype: str
    frames: tuple[FrameInfo, ...]
    checksum: int            # xxh3_64 over the wire bytes of the payload frames, in order
    attempt: int

    @property
    def info(self) -> KVInfo:
        return KVInfo(self.shape, self.dtype)  # type: ignore[arg-type]

    @property
    def spec(self) -> ChunkSpec:
        return ChunkSpec(self.index, self.plane_start, self.plane_stop, self.token_start, self.token_stop)

    def transfer_key(self) -> tuple:
        """The fields every chunk of one transfer must agree on."""
        return (self.request_id, self.shape, self.dtype, self.mode, self.token_offset, self.num_chunks)


@dataclass(frozen=True, slots=True)
class End:
    """sender -> receiver: every chunk was sent; digest = xxh3_64 of the chunk checksums in order."""

    transfer_id: str
    request_id: str
    num_chunks: int
    raw_bytes: int
    digest: int


@dataclass(frozen=True, slots=True)
class Abort:
    """sender -> receiver: drop this transfer (the request was cancelled); idempotent."""

    transfer_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Ack:
    """receiver -> sender: chunk `index` verified and decoded; returns one credit."""

    transfer_id: str
    index: int


@dataclass(frozen=True, slots=True)
class Nack:
    """receiver -> sender: resend chunk `index` (-1: resend END); returns one credit."""

    transfer_id: str
    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class Done:
    """receiver -> sender: the transfer is complete and verified (ok) or failed closed."""

    transfer_id: str
    ok: bool
    reason: str
    checksum_failures: int
    rejected: int


Message = Chunk | End | Abort | Ack | Nack | Done
KINDS: dict[type[Message], int] = {Chunk: CHUNK, End: END, Abort: ABORT, Ack: ACK, Nack: NACK, Done: DONE}
TYPES = {kind: cls for cls, kind in KINDS.items()}
_FRAMES_FIELD = Chunk.__slots__.index("frames")
_SHAPE_FIELD = Chunk.__slots__.index("shape")


def encode_header(message: Message) -> bytes:
    # Plain attribute reads: dataclasses.astuple deep-copies every field, which cost more than the
    # msgpack and the checksum together on the data plane's per-chunk path.
    if isinstance(message, Chunk):
        fields = _chunk_fields(message)
    else:
        fields = [getattr(message, name) for name in type(message).__slots__]
    body = MAGIC + bytes((VERSION, KINDS[type(message)])) + msgpack.packb(fields, use_bin_type=True)
    return body + xxhash.xxh3_64_intdigest(body).to_bytes(8, "little")


def _chunk_fields(chunk: Chunk) -> list[Any]:
    fields = [getattr(chunk, name) for name in Chunk.__slots__]
    fields[_FRAMES_FIELD] = [[f.codec, f.shuffle, f.raw_len, f.wire_len] for f in chunk.frames]
    return fields


def encode_message(message: Message, payload: list[Any] | None = None) -> list[Any]:
    """Frames of a message: the header frame, then (CHUNK only) the wire payload frames."""
    return [encode_header(message), *(payload or [])]


def decode_header(frame) -> Message:
    """Parse and validate a header frame; raises KVFrameError only."""
    size = memoryview(frame).nbytes
    if size > checks.MAX_HEADER_BYTES:   # refused before it is copied or unpacked
        raise KVFrameError(f"header frame of {size} bytes is over MAX_HEADER_BYTES")
    data = bytes(frame)
    if len(data) < _PREFIX + _TRAILER + 1 or data[: len(MAGIC)] != MAGIC:
        raise KVFrameError("not a KV frame (bad magic or too short)")
    if data[len(MAGIC)] != VERSION:
        raise KVFrameError(f"unsupported KV protocol version {data[len(MAGIC)]}")
    body, trailer = data[:-_TRAILER], data[-_TRAILER:]
    if xxhash.xxh3_64_intdigest(body) != int.from_bytes(trailer, "little"):
        raise KVFrameError("header checksum mismatch")
    cls = TYPES.get(data[len(MAGIC) + 1])
    if cls is None:
        raise KVFrameError(f"unknown KV message kind {data[len(MAGIC) + 1]}")
    try:
        fields = msgpack.unpackb(body[_PREFIX:], use_list=True, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        raise KVFrameError(f"undecodable header: {exc}") from exc
    if not isinstance(fields, list) or len(fields) != len(cls.__slots__):
        raise KVFrameError(f"{cls.__name__} header needs {len(cls.__slots__)} fields")
    return _VALIDATORS[cls](fields)


def peek_transfer_id(frame) -> str:
    """The transfer id a header frame names, for a log line about a message that failed; "" when
    it names none. Validates nothing else: never trust what it returns beyond a log."""
    try:
        if memoryview(frame).nbytes > checks.MAX_HEADER_BYTES:
            return ""
        fields = msgpack.unpackb(bytes(frame)[_PREFIX:-_TRAILER], raw=False, strict_map_key=True)
        transfer_id = fields[0] if isinstance(fields, list) and fields else ""
    except Exception:   # a log helper must not raise: whatever the frame holds
        return ""
    return transfer_id if type(transfer_id) is str and len(transfer_id) <= checks.MAX_ID_LEN else ""


def decode_message(frames: list[Any]) -> tuple[Message, list[Any]]:
    """(message, payload frames); checks frame count and wire lengths against the header."""
    if not frames:
        raise KVFrameError("empty message")
    message = decode_header(frames[0])
    payload = list(frames[1:])
    expected = len(message.frames) if isinstance(message, Chunk) else 0
    if len(payload) != expected:
        raise KVFrameError(f"{type(message).__name__} has {len(payload)} payload frames, expected {expected}")
    if isinstance(message, Chunk):
        for info, frame in zip(message.frames, payload, strict=True):
            if len(memoryview(frame).cast("B")) != info.wire_len:
                raise KVFrameError("payload frame length does not match its header")
    return message, payload


def _chunk(fields: list[Any]) -> Chunk:
    checks.check_chunk(fields)
    fields[_FRAMES_FIELD] = tuple(FrameInfo(*entry) for entry in fields[_FRAMES_FIELD])
    fields[_SHAPE_FIELD] = tuple(fields[_SHAPE_FIELD])
    return Chunk(*fields)


def _checked(cls: type, check):
    def build(fields: list[Any]) -> Message:
        check(fields)
        return cls(*fields)
    return build


_VALIDATORS = {Chunk: _chunk, End: _checked(End, checks.check_end), Abort: _checked(Abort, checks.check_abort),
               Ack: _checked(Ack, checks.check_ack), Nack: _checked(Nack, checks.check_nack),
               Done: _checked(Done, checks.check_done)}
