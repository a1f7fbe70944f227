"""One chunk end to end, without I/O: quantize -> checksum -> compress, and back with verification.

Contract: `ChunkEncoder(kv, ...)` plans the chunks of one transfer and `encode(index, attempt, outs)`
returns the CHUNK header and wire payload frames of chunk `index`, writing into the caller's reusable
`outs` buffers (the sender keeps them untouched until the chunk is acknowledged).
`verify_and_decode(chunk, payload, quantizer, dst)` checks the checksum, decompresses and only then
writes the chunk into `dst`; it raises KVChecksumError / KVFrameError and writes nothing on error.
It is `decode(chunk, verify(chunk, payload), quantizer, dst)`: a receiver may acknowledge a chunk
between the two steps. A `RawPieces` destination (bus/kv/pieces.py) keeps a verified raw chunk's
payload as it is instead of copying it; any other mode into one raises KVValueError.
The checksum (xxh3_64) covers the wire bytes of the payload frames: every flipped bit is caught,
even one an lz4 decoder would ignore, and nothing corrupt ever reaches a decompressor.
A KV source still being computed (a prefill engine's export, encoded as layers finish) may offer
`ready(spec) -> bool` (may that chunk be encoded now without waiting) and `when_ready(spec,
callback)` (call `callback()` once, from any thread, when it may, or at once if it already may);
`ChunkEncoder.ready(index)` / `when_ready(index, callback)` ask it, and say yes for any other KV.
A KV or a chunk plan beyond the protocol's bounds (bus/kv/header_checks.py) is refused with
KVValueError when the encoder is made, before anything is sent.
A raw or bf16 chunk is encoded into one buffer and sent as the frames of quant.frame_specs_of
(views, no copy); each frame is compressed on its own, `auto` deciding once a chunk for all of them
(one kind), and decoded (or kept) as the rows it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from bus.kv.compress import COMPRESSION_MODES, AutoCompression, compress_frame, decompress_frame
from bus.kv.frames import Chunk, FrameInfo
from bus.kv.header_checks import MAX_CHUNK_BYTES, MAX_CHUNKS, MAX_DIM, MAX_KV_BYTES
from bus.kv.kv_errors import KVChecksumError, KVValueError
from bus.kv.layout import DEFAULT_CHUNK_BYTES, KVInfo, chunk_bytes_for, plan_chunks
from bus.kv.pieces import RawPieces
from bus.kv.quant import FRAMED_MODES, MODES, Quantizer, frame_specs_of, max_payload_sizes, payload_sizes


def payload_checksum(frames: list[Any]) -> int:
    hasher = xxhash.xxh3_64()
    for frame in frames:
        hasher.update(frame)
    return hasher.intdigest()


def transfer_digest(checksums: np.ndarray) -> int:
    """The whole-transfer checksum: xxh3_64 of the chunk checksums (uint64 LE) in chunk order."""
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(checksums, dtype="<u8").tobytes())


class ChunkEncoder:
    """Encodes the chunks of one KV source for one transfer."""

    def __init__(self, kv: Any, quantizer: Quantizer, *, transfer_id: str, request_id: str,
                 mode: str = "int8", compression: str = "auto", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 auto: AutoCompression | None = None, token_offset: int = 0, dtype: str | None = None) -> None:
        if mode not in MODES:
            raise KVValueError(f"unknown quantization mode {mode!r}; expected one of {MODES}")
        if compression not in COMPRESSION_MODES:
            raise KVValueError(f"unknown compression {compression!r}; expected one of {COMPRESSION_MODES}")
        if compression == "auto" and auto is None:
            raise KVValueError("compression='auto' needs an AutoCompression (the link speed)")
        self.kv, self.quantizer = kv, quantizer
        self.info: KVInfo = quantizer.kv_info(kv, dtype)
        if self.info.nbytes > MAX_KV_BYTES or max(self.info.shape) >= MAX_DIM:
            raise KVValueError(f"KV of shape {self.info.shape} is over the protocol's bounds (header_checks)")
        self.specs = plan_chunks(self.info, chunk_bytes_for(self.info, mode, chunk_bytes))
        self.transfer_id, self.request_id, self.token_offset = transfer_id, request_id, token_offset
        self.mode, self.compression, self.auto = mode, compression, auto
        self._check_plan()
        self.checksums = np.zeros(len(self.specs), np.uint64)

    def _check_plan(self) -> None:
        """Refuse, before any I/O, a plan every receiver would refuse chunk by chunk."""
        largest = sum(self.buffer_sizes())
        if len(self.specs) > MAX_CHUNKS or largest > MAX_CHUNK_BYTES:
            raise KVValueError(f"{len(self.specs)} chunks of up to {largest} payload bytes: over the protocol's "
                               f"{MAX_CHUNKS} chunks or {MAX_CHUNK_BYTES} bytes a chunk; choose another chunk_bytes")

    @property
    def num_chunks(self) -> int:
        return len(self.specs)

    def ready(self, index: int) -> bool:
        """Whether chunk `index` can be encoded now, without waiting for its KV to be computed."""
        ready = getattr(self.kv, "ready", None)
        return ready is None or bool(ready(self.specs[index]))

    def when_ready(self, index: int, callback: Callable[[], None]) -> None:
        """`callback()` once chunk `index` can be encoded (from the thread that computes the KV)."""
        when_ready = getattr(self.kv, "when_ready", None)
        if when_ready is None:
            callback()
        else:
            when_ready(self.specs[index], callback)

    def buffer_sizes(self) -> list[int]:
        """Capacity of the `outs` buffers one in-flight chunk needs."""
        return max_payload_sizes(self.mode, max(s.num_rows for s in self.specs), self.info)

    def encode(self, index: int, outs: list[np.ndarray]) -> tuple[Chunk, list[Any]]:
        spec = self.specs[index]
        payload = self.quantizer.encode(self.kv, self.info, spec, self.mode, outs)
        frames = [memoryview(f).cast("B") for f in payload.frames]
        if self.mode in FRAMED_MODES:
            frames = _cut(frames[0], payload_sizes(self.mode, spec, self.info))
        infos, wire = [], []
        framed, choice = self.mode in FRAMED_MODES, None
        for slot, frame in enumerate(frames):
            # A raw or bf16 chunk's frames are one kind: decided once a chunk, as auto's resample
            # counts assume (asked per frame, it resampled 3-4x as often and did its bookkeeping 4x).
            if not framed or choice is None:
                choice = self._choose(0 if framed else slot, frame)
            codec, shuffle = choice
            data = compress_frame(frame, codec, shuffle)
            infos.append(FrameInfo(codec, shuffle, len(frame), len(memoryview(data).cast("B"))))
            wire.append(data)
        checksum = payload_checksum(wire)
        self.checksums[index] = checksum
        header = Chunk(self.transfer_id, self.request_id, self.info.shape, self.info.dtype, self.mode,
                       self.token_offset, len(self.specs), index, spec.plane_start, spec.plane_stop,
                       spec.token_start, spec.token_stop, payload.scale_dtype, tuple(infos), checksum, 0)
        return header, wire

    def _choose(self, slot: int, frame: memoryview) -> tuple[str, int]:
        itemsize = self._itemsize(slot)
        if self.compression == "auto":
            choice = self.auto.choose((self.mode, self.info.dtype, slot), frame, itemsize)  # type: ignore[union-attr]
            return choice.codec, choice.shuffle
        return self.compression, 0

    def _itemsize(self, slot: int) -> int:
        if slot == 0 and self.mode == "raw":
            return self.info.itemsize
        return 2 if (slot == 0 and self.mode == "bf16") else 1

    def digest(self) -> int:
        return transfer_digest(self.checksums)


def _cut(frame: memoryview, sizes: list[int]) -> list[memoryview]:
    """Consecutive views of `frame` of the given sizes (which add up to its length)."""
    views, start = [], 0
    for size in sizes:
        views.append(frame[start:start + size])
        start += size
    return views


def verify(chunk: Chunk, payload: list[Any]) -> list[np.ndarray]:
    """Check one received chunk's checksum and decompress it: its raw payload frames, ready to decode."""
    if payload_checksum(payload) != chunk.checksum:
        raise KVChecksumError(f"chunk {chunk.index} of transfer {chunk.transfer_id}: checksum mismatch")
    raw = [decompress_frame(frame, f.codec, f.shuffle, f.raw_len) for f, frame in zip(chunk.frames, payload, strict=True)]
    return [np.frombuffer(r, np.uint8) for r in raw]


def decode(chunk: Chunk, arrays: list[np.ndarray], quantizer: Quantizer, dst: Any) -> int:
    """Write a verified chunk into dst (a RawPieces keeps a raw chunk's payload instead of copying
    it); returns the wire bytes it carried."""
    if isinstance(dst, RawPieces) and chunk.mode != "raw":
        raise KVValueError(f"a {chunk.mode} chunk cannot be kept as raw pieces")
    if chunk.mode not in FRAMED_MODES:
        quantizer.decode(arrays, chunk.info, chunk.spec, chunk.mode, chunk.scale_dtype, dst)
    else:   # one frame at a time, as the rows it holds (the header's sizes were checked against these)
        for part, array in zip(frame_specs_of(chunk.mode, chunk.spec, chunk.info), arrays, strict=True):
            if isinstance(dst, RawPieces):
                dst.keep(part, array)
            else:
                quantizer.decode([array], chunk.info, part, chunk.mode, chunk.scale_dtype, dst)
    return sum(f.wire_len for f in chunk.frames)


def verify_and_decode(chunk: Chunk, payload: list[Any], quantizer: Quantizer, dst: Any) -> int:
    """Verify one received chunk and write it into dst; returns the wire bytes it carried."""
    return decode(chunk, verify(chunk, payload), quantizer, dst)
