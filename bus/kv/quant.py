"""Quantization modes and the numpy quantizer (the reference path; no torch in bus/).

Modes (chosen per cluster; the header of every chunk names its mode):
- `raw`      the engine's own dtype, bit-exact; frames of whole planes (layout.frame_specs).
- `bf16`     bfloat16 bits (round to nearest even); frames as raw's; rel. error <= 2**-8.
- `int8`     the default: per-token asymmetric, one (lo, hi) pair per head_dim row. Frame 0 holds
             uint8 codes, frame 1 the params: lo[rows] then hi[rows], as float16 when the row range
             fits (rounded outward, so the encoder quantizes with exactly the params the decoder
             reads), else float32 (`scale_dtype` in the header). x ~ code * (hi - lo) / 255 + lo;
             error <= (hi - lo) / 510 per value.
- `int8_sym` per-token symmetric: one scale per row (frame 1), int8 codes in [-127, 127];
             x ~ code * scale; error <= scale / 2. Slightly smaller, measurably less accurate.

Contract: a `Quantizer` (this module's `NumpyQuantizer`, or the compiled torch one in
nodes/engines/kv_quant.py) encodes one chunk of a KV source into payload buffers and decodes
verified payload buffers into a chunk of a preallocated destination of the engine's dtype.
Payload sizes are fixed by (mode, chunk, dtype, scale_dtype) and checked before decoding.
A quantizer encodes a raw or bf16 chunk as one buffer and decodes one frame at a time:
`payload_sizes` are the frames on the wire (`frame_specs_of` says which rows each holds),
`max_payload_sizes` the buffers a quantizer writes; `num_payload_frames` and `payload_bytes` are
their count and total by arithmetic alone, for checking a received header before building anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bus.kv.kv_errors import KVFrameError, KVValueError
from bus.kv.layout import (
    DTYPES,
    ChunkSpec,
    KVInfo,
    as_planes,
    bf16_bits_to_f32,
    f32_to_bf16_bits,
    frame_specs,
    num_frames,
    numpy_kv_info,
)

MODES = ("raw", "bf16", "int8", "int8_sym")
SCALE_DTYPES: dict[str, np.dtype] = {"f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
PARAMS_PER_ROW = {"int8": 2, "int8_sym": 1}
FRAMED_MODES = ("raw", "bf16")   # one value per element: their payload travels as frame_specs' frames


@dataclass(frozen=True, slots=True)
class EncodedPayload:
    """Payload buffers of one chunk (views, valid until the sender reuses its buffers)."""

    frames: list[Any]
    scale_dtype: str = ""


def value_bytes(mode: str, info: KVInfo) -> int:
    """Bytes a value takes in a raw or bf16 payload."""
    return info.itemsize if mode == "raw" else 2


def frame_specs_of(mode: str, spec: ChunkSpec, info: KVInfo) -> list[ChunkSpec]:
    """The rows each payload frame of a raw or bf16 chunk holds, in frame order."""
    return frame_specs(spec, info, value_bytes(mode, info))


def _buffer_sizes(mode: str, spec: ChunkSpec, info: KVInfo, scale_dtype: str) -> list[int]:
    values = spec.num_rows * info.head_dim
    if mode in FRAMED_MODES:
        return [values * value_bytes(mode, info)]
    if mode in PARAMS_PER_ROW:
        if scale_dtype not in SCALE_DTYPES:
            raise KVFrameError(f"mode {mode} needs scale_dtype f16|f32, got {scale_dtype!r}")
        return [values, spec.num_rows * PARAMS_PER_ROW[mode] * SCALE_DTYPES[scale_dtype].itemsize]
    raise KVFrameError(f"unknown quantization mode {mode!r}")


def payload_sizes(mode: str, spec: ChunkSpec, info: KVInfo, scale_dtype: str = "") -> list[int]:
    """Byte length of each payload frame of a chunk on the wire; raises KVFrameError on a bad
    combination."""
    if mode in FRAMED_MODES:
        size = value_bytes(mode, info) * info.head_dim
        return [part.num_rows * size for part in frame_specs_of(mode, spec, info)]
    return _buffer_sizes(mode, spec, info, scale_dtype)


def num_payload_frames(mode: str, spec: ChunkSpec, info: KVInfo) -> int:
    """len(payload_sizes(...)) in O(1): raw and bf16 as layout.num_frames, the int8 modes two."""
    return num_frames(spec, info, value_bytes(mode, info)) if mode in FRAMED_MODES else 2


def payload_bytes(mode: str, spec: ChunkSpec, info: KVInfo, scale_dtype: str = "") -> int:
    """sum(payload_sizes(...)) in O(1): the chunk's raw payload bytes."""
    return sum(_buffer_sizes(mode, spec, info, scale_dtype))


def max_payload_sizes(mode: str, max_rows: int, info: KVInfo) -> list[int]:
    """Capacity of each payload buffer a sender must preallocate for chunks of <= max_rows rows
    (a raw or bf16 chunk is encoded into one buffer, then cut into its frames)."""
    spec = ChunkSpec(0, 0, max_rows, 0, 1)
    return _buffer_sizes(mode, spec, info, "f32" if mode in PARAMS_PER_ROW else "")


class Quantizer(Protocol):
    """The compute seam: `NumpyQuantizer` here, the compiled torch one in nodes/engines/kv_quant.py."""

    def kv_info(self, kv: Any, dtype: str | None = None) -> KVInfo:
        """Shape and dtype of a KV source; raises KVValueError when it cannot be read."""

    def encode(self, kv: Any, info: KVInfo, spec: ChunkSpec, mode: str, outs: list[np.ndarray]) -> EncodedPayload:
        """Encode one chunk of `kv` into `outs` (uint8 buffers of max_payload_sizes) or views of kv."""

    def dst_dtype(self, dst: Any) -> str:
        """The KV dtype name of a destination the receiver's allocator returned."""

    def decode(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str,
               scale_dtype: str, dst: Any) -> None:
        """Write a verified chunk into dst (layers, 2, heads, tokens, head_dim) of the engine's dtype."""


OUTWARD = np.float32(2.0**-10)   # > half a float16 ulp (relative): round-to-nearest stays outward
F16_TINY = np.float32(2.0**-24)  # the float16 subnormal step


def outward_params(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """float16 (lo <= low, hi >= high) when representable, else the float32 values themselves.

    Widening by 2**-10 relative (+ the subnormal step) before rounding to nearest makes the float16
    values enclose the row; the torch path computes the very same expression.
    """
    low32, high32 = low.astype(np.float32), high.astype(np.float32)
    with np.errstate(over="ignore"):
        lo = (low32 - (np.abs(low32) * OUTWARD + F16_TINY)).astype(np.float16)
        hi = (high32 + (np.abs(high32) * OUTWARD + F16_TINY)).astype(np.float16)
    if np.isfinite(lo).all() and np.isfinite(hi).all():
        return lo, hi, "f16"
    return low32, high32, "f32"


def int8_step(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The quantization step of each row, computed identically on both sides."""
    return (hi.astype(np.float32) - lo.astype(np.float32)) / np.float32(255)


class NumpyQuantizer:
    """Vectorised numpy implementation of every mode, with reused scratch buffers."""

    def __init__(self) -> None:
        self._scratch = np.empty(0, np.float32)

    def _f32_scratch(self, num_values: int) -> np.ndarray:
        if self._scratch.size < num_values:
            self._scratch = np.empty(num_values, np.float32)
        return self._scratch[:num_values]

    def kv_info(self, kv: Any, dtype: str | None = None) -> KVInfo:
        if not isinstance(kv, np.ndarray):
            try:
                kv = np.asarray(memoryview(kv)) if not hasattr(kv, "__dlpack__") else np.from_dlpack(kv)
            except (TypeError, ValueError, BufferError, RuntimeError) as exc:
                raise KVValueError(f"cannot read KV of type {type(kv).__name__}: {exc}") from exc
        return numpy_kv_info(kv, dtype)

    def dst_dtype(self, dst: Any) -> str:
        names = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16",
                 np.dtype(np.uint16): "bfloat16"}
        if not isinstance(dst, np.ndarray) or dst.dtype not in names:
            raise KVValueError(f"destination must be a float32/float16/uint16(bf16) numpy array, got {dst!r:.80}")
        return names[dst.dtype]

    def _chunk(self, kv: Any, info: KVInfo, spec: ChunkSpec) -> np.ndarray:
        array = kv if isinstance(kv, np.ndarray) else np.from_dlpack(kv)
        return as_planes(array.view(DTYPES[info.dtype]), info)[spec.planes, spec.tokens]

    def _as_f32(self, chunk: np.ndarray, dtype: str) -> np.ndarray:
        out = self._f32_scratch(chunk.size).reshape(chunk.shape)
        if dtype == "bfloat16":
            return bf16_bits_to_f32(chunk, out)
        np.copyto(out, chunk)
        return out

    def encode(self, kv: Any, info: KVInfo, spec: ChunkSpec, mode: str, outs: list[np.ndarray]) -> EncodedPayload:
        chunk = self._chunk(kv, info, spec)
        if mode == "raw" or (mode == "bf16" and info.dtype == "bfloat16"):
            if chunk.flags.c_contiguous:
                return EncodedPayload([chunk.reshape(-1).view(np.uint8)])
            out = outs[0][: chunk.nbytes].view(chunk.dtype).reshape(chunk.shape)
            np.copyto(out, chunk)
            return EncodedPayload([out.reshape(-1).view(np.uint8)])
        values = chunk if info.dtype == "float32" else self._as_f32(chunk, info.dtype)
        rows = values.reshape(spec.num_rows, info.head_dim)
        if mode == "bf16":
            out = outs[0][: rows.size * 2].view(np.uint16).reshape(rows.shape)
            f32_to_bf16_bits(rows, out)
            return EncodedPayload([outs[0][: rows.size * 2]])
        if mode == "int8":
            return self._encode_int8(rows, outs)
        if mode == "int8_sym":
            return self._encode_int8_sym(rows, outs)
        raise KVValueError(f"unknown quantization mode {mode!r}")

    def _finite_range(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low, high = rows.min(axis=1), rows.max(axis=1)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise KVValueError("KV holds non-finite values; int8 cannot encode them (use raw)")
        return low, high

    def _encode_int8(self, rows: np.ndarray, outs: list[np.ndarray]) -> EncodedPayload:
        lo, hi, scale_dtype = outward_params(*self._finite_range(rows))
        step = int8_step(lo, hi)
        inverse = np.divide(np.float32(1), step, out=np.zeros_like(step), where=step > 0)
        work = self._f32_scratch(rows.size).reshape(rows.shape)
        np.subtract(rows, lo.astype(np.float32)[:, None], out=work)
        np.multiply(work, inverse[:, None], out=work)
        np.add(work, np.float32(0.5), out=work)  # then truncation = round half up, within [0, 255]
        codes = outs[0][: rows.size].reshape(rows.shape)
        np.copyto(codes, work, casting="unsafe")
        params = _params_view(outs[1], 2 * len(lo), scale_dtype)
        params[: len(lo)], params[len(lo):] = lo, hi
        return EncodedPayload([outs[0][: rows.size], params.view(np.uint8)], scale_dtype)

    def _encode_int8_sym(self, rows: np.ndarray, outs: list[np.ndarray]) -> EncodedPayload:
        low, high = self._finite_range(rows)
        amax = np.maximum(np.abs(low), np.abs(high)).astype(np.float32) / np.float32(127)
        _, scale, scale_dtype = outward_params(amax, amax)
        scale32 = scale.astype(np.float32)
        inverse = np.divide(np.float32(1), scale32, out=np.zeros_like(scale32), where=scale32 > 0)
        work = self._f32_scratch(rows.size).reshape(rows.shape)
        np.multiply(rows, inverse[:, None], out=work)
        np.rint(work, out=work)
        np.clip(work, -127, 127, out=work)
        codes = outs[0][: rows.size].view(np.int8).reshape(rows.shape)
        np.copyto(codes, work, casting="unsafe")
        params = _params_view(outs[1], len(scale), scale_dtype)
        params[:] = scale
        return EncodedPayload([outs[0][: rows.size], params.view(np.uint8)], scale_dtype)

    def decode(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str,
               scale_dtype: str, dst: Any) -> None:
        dst_dtype = self.dst_dtype(dst)
        target = as_planes(dst, info)[spec.planes, spec.tokens]
        shape = target.shape
        if mode == "raw" and dst_dtype == info.dtype:
            np.copyto(target, payload[0].view(target.dtype).reshape(shape))
            return
        if mode == "bf16" and dst_dtype == "bfloat16":
            np.copyto(target, payload[0].view(np.uint16).reshape(shape))
            return
        direct = dst_dtype == "float32"
        values = target if direct else self._f32_scratch(target.size).reshape(shape)
        self._decode_f32(payload, info, spec, mode, scale_dtype, values)
        if not direct:
            if dst_dtype == "bfloat16":
                f32_to_bf16_bits(values, target)
            else:
                np.copyto(target, values, casting="unsafe")

    def _decode_f32(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str,
                    scale_dtype: str, out: np.ndarray) -> None:
        rows = (out.shape[0], out.shape[1], 1)
        if mode == "raw" and info.dtype == "bfloat16" or mode == "bf16":
            bf16_bits_to_f32(payload[0].view(np.uint16).reshape(out.shape), out)
        elif mode == "raw":
            np.copyto(out, payload[0].view(DTYPES[info.dtype]).reshape(out.shape), casting="unsafe")
        elif mode == "int8":
            params = payload[1].view(SCALE_DTYPES[scale_dtype])
            lo, hi = params[: spec.num_rows], params[spec.num_rows:]
            np.multiply(payload[0].reshape(out.shape), int8_step(lo, hi).reshape(rows), out=out)
            np.add(out, lo.astype(np.float32).reshape(rows), out=out)
        elif mode == "int8_sym":
            scale = payload[1].view(SCALE_DTYPES[scale_dtype]).astype(np.float32)
            np.multiply(payload[0].view(np.int8).reshape(out.shape), scale.reshape(rows), out=out)
        else:
            raise KVFrameError(f"unknown quantization mode {mode!r}")


def _params_view(buffer: np.ndarray, count: int, scale_dtype: str) -> np.ndarray:
    dtype = SCALE_DTYPES[scale_dtype]
    return buffer[: count * dtype.itemsize].view(dtype)
