"""KV data-plane messages and their wire form; the only KV module that touches msgpack.

Every message is a multipart ZeroMQ message whose first frame is the header frame:

    b"PDKV" | version (1 byte) | kind (1 byte) | msgpack array of fields | xxh3_64 (8 bytes, LE)

The trailing xxh3_64 covers everything before it, so a flipped bit anywhere in a header is caught
before a field is trusted. CHUNK messages carry their payload as further frames (sent with
copy=False); the others are header-only. `encode_message` / `decode_message` convert between the
frozen dataclasses below and frames; `decode_message` validates every field and raises only
KVFrameError. docs/PROTOCOL.md part 2 is the normative description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from bus.kv.compress import CODECS
from bus.kv.errors import KVFrameError
from bus.kv.layout import DTYPES, ChunkSpec, KVInfo
from bus.kv.quant import MODES, SCALE_DTYPES, payload_sizes

MAGIC = b"PDKV"
VERSION = 2   # 2: raw and bf16 payloads travel as frames of whole planes (layout.frame_specs)
CHUNK, END, ABORT, ACK, NACK, DONE = 1, 2, 3, 17, 18, 19
_PREFIX = len(MAGIC) + 2
_TRAILER = 8
MAX_ID_LEN = 128
U64 = 2**64


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
KINDS: dict[type, int] = {Chunk: CHUNK, End: END, Abort: ABORT, Ack: ACK, Nack: NACK, Done: DONE}
TYPES = {kind: cls for cls, kind in KINDS.items()}
_FRAMES_FIELD = Chunk.__slots__.index("frames")


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


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise KVFrameError(f"invalid header field: {what}")


def _is_int(value: Any, low: int = 0, high: int = U64) -> bool:
    return type(value) is int and low <= value < high


def _is_id(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_LEN


def _is_text(value: Any) -> bool:
    return type(value) is str and len(value) <= 1024


def _chunk(fields: list[Any]) -> Chunk:
    tid, rid, shape, dtype, mode, offset, count, index, p0, p1, t0, t1, scale, frames, checksum, attempt = fields
    _check(_is_id(tid) and _is_id(rid), "transfer_id/request_id")
    _check(isinstance(shape, list) and len(shape) == 5 and all(_is_int(n, 1, 2**31) for n in shape)
           and shape[1] == 2, "shape")
    _check(dtype in DTYPES and mode in MODES, "dtype/mode")
    _check(_is_int(offset, 0, 2**40) and _is_int(count, 1, 2**31) and _is_int(index, 0, count), "chunk index")
    planes = shape[0] * 2 * shape[2]
    _check(_is_int(p0, 0, planes) and _is_int(p1, p0 + 1, planes + 1), "plane range")
    _check(_is_int(t0, 0, shape[3]) and _is_int(t1, t0 + 1, shape[3] + 1), "token range")
    _check(scale in SCALE_DTYPES if mode.startswith("int8") else scale == "", "scale_dtype")
    _check(isinstance(frames, list) and all(isinstance(f, list) and len(f) == 4 for f in frames), "frames")
    infos = tuple(FrameInfo(*f) for f in frames)
    for f in infos:
        _check(f.codec in CODECS and f.shuffle in (0, 2, 4) and _is_int(f.raw_len, 0, 2**40)
               and _is_int(f.wire_len, 0, 2**40), "frame codec/lengths")
        _check(f.codec != "none" or (f.shuffle == 0 and f.raw_len == f.wire_len), "stored frame")
        _check(f.shuffle == 0 or f.raw_len % f.shuffle == 0, "shuffle element size")
    _check(_is_int(checksum) and _is_int(attempt, 0, 2**16), "checksum/attempt")
    chunk = Chunk(tid, rid, tuple(shape), dtype, mode, offset, count, index, p0, p1, t0, t1, scale,
                  infos, checksum, attempt)
    _check([f.raw_len for f in infos] == payload_sizes(mode, chunk.spec, chunk.info, scale), "payload sizes")
    return chunk


def _end(fields: list[Any]) -> End:
    tid, rid, count, raw_bytes, digest = fields
    _check(_is_id(tid) and _is_id(rid) and _is_int(count, 1, 2**31), "end ids/count")
    _check(_is_int(raw_bytes, 0, 2**50) and _is_int(digest), "end bytes/digest")
    return End(tid, rid, count, raw_bytes, digest)


def _abort(fields: list[Any]) -> Abort:
    _check(_is_id(fields[0]) and _is_text(fields[1]), "abort")
    return Abort(*fields)


def _ack(fields: list[Any]) -> Ack:
    _check(_is_id(fields[0]) and _is_int(fields[1], 0, 2**31), "ack")
    return Ack(*fields)


def _nack(fields: list[Any]) -> Nack:
    _check(_is_id(fields[0]) and _is_int(fields[1], -1, 2**31) and _is_text(fields[2]), "nack")
    return Nack(*fields)


def _done(fields: list[Any]) -> Done:
    tid, ok, reason, failures, rejected = fields
    _check(_is_id(tid) and type(ok) is bool and _is_text(reason), "done")
    _check(_is_int(failures, 0, 2**31) and _is_int(rejected, 0, 2**31), "done counters")
    return Done(tid, ok, reason, failures, rejected)


_VALIDATORS = {Chunk: _chunk, End: _end, Abort: _abort, Ack: _ack, Nack: _nack, Done: _done}
