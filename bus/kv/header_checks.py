"""Field checks of KV header frames: type, range and consistency, before anything is built.

Contract: `check_chunk(fields)`, `check_end`, `check_abort`, `check_ack`, `check_nack` and
`check_done` take the msgpack-decoded field list of one header (already of the kind's length),
raise KVFrameError at the first field that breaks docs/PROTOCOL.md part 2's "Field rules", and
return nothing. A field's type is checked before its value is hashed, ordered or used in
arithmetic, so a list, a dict, a float or a bool where an int or a name belongs is a KVFrameError
like any other bad value. The work is O(fields): how many payload frames a chunk has and how many
bytes they hold are computed from its ranges (quant.num_payload_frames / payload_bytes), never
enumerated, and the chunk's frame list is compared with that count before it is read.

Bounds, the same on every node (why each: at its definition). A receiver may narrow the byte
bounds further (recv_core.ReceiveConfig) and sizes its socket's ZeroMQ MAXMSGSIZE from
`max_message_bytes(max_chunk_bytes)`.
"""

from __future__ import annotations

import math
from typing import Any

from bus.kv.compress import CODECS
from bus.kv.kv_errors import KVFrameError
from bus.kv.layout import DTYPES, ChunkSpec, KVInfo
from bus.kv.quant import MODES, PARAMS_PER_ROW, SCALE_DTYPES, num_payload_frames, payload_bytes, payload_sizes

# A header frame: a chunk's entry per payload frame is ~20 bytes, so this leaves room for the
# ~2,000 frames of a 1 GiB raw chunk; every other header is under 5 KiB.
MAX_HEADER_BYTES = 64 * 1024
MAX_ID_LEN = 128
MAX_TEXT_LEN = 1024
U64 = 2**64
MAX_DIM = 2**31                 # each of the five shape dimensions
# One transfer's KV (shape x dtype): 1 TiB, 25x a 128k-token Llama-70B cache in bf16. Keeps every
# product of header fields far from overflow in the numpy code behind the checks.
MAX_KV_BYTES = 2**40
# One chunk's raw payload (the sum of its frames' raw_len): the largest `[kv] chunk_mib` a node
# accepts (1024 MiB). It bounds what a decompressor is asked to produce from a few wire bytes.
MAX_CHUNK_BYTES = 2**30
# Chunks in one transfer: a 64 GiB KV in 64 KiB chunks. The receiver keeps 9 bytes per chunk and
# NACKs missing ones by index.
MAX_CHUNKS = 2**20
MAX_TOKEN_OFFSET = 2**40
MAX_ATTEMPTS = 2**16
MAX_COUNTER = 2**31
SHUFFLES = (0, 2, 4)


def wire_bound(raw_len: int) -> int:
    """The most bytes lz4 or zstd turn `raw_len` bytes into (both libraries' compress bounds are
    below n + n/255 + 16 and n + n/256 + 64)."""
    return raw_len + (raw_len >> 7) + 64


def max_message_bytes(max_chunk_bytes: int = MAX_CHUNK_BYTES) -> int:
    """The largest frame a legitimate CHUNK carries (ZeroMQ's MAXMSGSIZE bounds each frame)."""
    return wire_bound(max_chunk_bytes) + MAX_HEADER_BYTES


def check_chunk(fields: list[Any]) -> None:
    tid, rid, shape, dtype, mode, offset, count, index, p0, p1, t0, t1, scale, frames, checksum, attempt = fields
    _check(_is_id(tid) and _is_id(rid), "transfer_id/request_id")
    _check(_is_name(dtype, DTYPES) and _is_name(mode, MODES), "dtype/mode")
    info = _kv_info(shape, dtype)
    spec = _chunk_spec(info, p0, p1, t0, t1)
    _check(_is_int(offset, 0, MAX_TOKEN_OFFSET), "token_offset")
    # Chunks cover the KV exactly once and hold at least a row each: planes x tokens bounds them.
    _check(_is_int(count, 1, min(MAX_CHUNKS, info.num_planes * info.num_tokens) + 1), "num_chunks")
    _check(_is_int(index, 0, count), "index")
    _check(_is_name(scale, SCALE_DTYPES) if mode in PARAMS_PER_ROW else scale == "", "scale_dtype")
    _check(payload_bytes(mode, spec, info, scale) <= MAX_CHUNK_BYTES, "chunk payload over MAX_CHUNK_BYTES")
    _check_frames(frames, mode, spec, info, scale)
    _check(_is_int(checksum, 0, U64) and _is_int(attempt, 0, MAX_ATTEMPTS), "checksum/attempt")


def _kv_info(shape: Any, dtype: str) -> KVInfo:
    _check(type(shape) is list and len(shape) == 5 and all(_is_int(n, 1, MAX_DIM) for n in shape)
           and shape[1] == 2, "shape")
    _check(math.prod(shape) * DTYPES[dtype].itemsize <= MAX_KV_BYTES, "shape: KV over MAX_KV_BYTES")
    return KVInfo(tuple(shape), dtype)


def _chunk_spec(info: KVInfo, p0: Any, p1: Any, t0: Any, t1: Any) -> ChunkSpec:
    _check(_is_int(p0, 0, info.num_planes) and _is_int(p1, p0 + 1, info.num_planes + 1), "plane range")
    _check(_is_int(t0, 0, info.num_tokens) and _is_int(t1, t0 + 1, info.num_tokens + 1), "token range")
    return ChunkSpec(0, p0, p1, t0, t1)   # the index does not change a chunk's sizes


def _check_frames(frames: Any, mode: str, spec: ChunkSpec, info: KVInfo, scale: str) -> None:
    expected = num_payload_frames(mode, spec, info)
    _check(type(frames) is list and len(frames) == expected, f"payload sizes: the chunk has {expected} frames")
    for entry in frames:
        _check(type(entry) is list and len(entry) == 4, "frames entry")
        codec, shuffle, raw_len, wire_len = entry
        _check(_is_name(codec, CODECS) and type(shuffle) is int and shuffle in SHUFFLES, "frame codec/shuffle")
        _check(_is_int(raw_len, 0, MAX_CHUNK_BYTES + 1), "frame raw_len")
        _check(_is_int(wire_len, 0, wire_bound(raw_len) + 1), "frame wire_len over its codec's bound")
        _check(codec != "none" or (shuffle == 0 and raw_len == wire_len), "stored frame")
        _check(shuffle == 0 or raw_len % shuffle == 0, "shuffle element size")
    # At most `expected` ranges are built here, and `expected` is the length of a list that fitted
    # in one header frame.
    _check([entry[2] for entry in frames] == payload_sizes(mode, spec, info, scale), "payload sizes")


def check_end(fields: list[Any]) -> None:
    tid, rid, count, raw_bytes, digest = fields
    _check(_is_id(tid) and _is_id(rid) and _is_int(count, 1, MAX_CHUNKS + 1), "end ids/count")
    _check(_is_int(raw_bytes, 0, MAX_KV_BYTES + 1) and _is_int(digest, 0, U64), "end bytes/digest")


def check_abort(fields: list[Any]) -> None:
    _check(_is_id(fields[0]) and _is_text(fields[1]), "abort")


def check_ack(fields: list[Any]) -> None:
    _check(_is_id(fields[0]) and _is_int(fields[1], 0, MAX_CHUNKS), "ack")


def check_nack(fields: list[Any]) -> None:
    _check(_is_id(fields[0]) and _is_int(fields[1], -1, MAX_CHUNKS) and _is_text(fields[2]), "nack")


def check_done(fields: list[Any]) -> None:
    tid, ok, reason, failures, rejected = fields
    _check(_is_id(tid) and type(ok) is bool and _is_text(reason), "done")
    _check(_is_int(failures, 0, MAX_COUNTER) and _is_int(rejected, 0, MAX_COUNTER), "done counters")


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise KVFrameError(f"invalid header field: {what}")


def _is_int(value: Any, low: int, high: int) -> bool:
    """An int (not a bool, not a float) in [low, high)."""
    return type(value) is int and low <= value < high


def _is_name(value: Any, names) -> bool:
    """One of `names`; the type first, so an unhashable value is never looked up."""
    return type(value) is str and value in names


def _is_id(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_LEN


def _is_text(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_TEXT_LEN
