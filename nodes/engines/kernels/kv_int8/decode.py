"""Decoding of the `int8` mode (per-token asymmetric) on numba, bit-identical to bus.kv.quant's.

Contract: where `AVAILABLE` (kv_int8.encode's: `kernels.cpu.probe().numba`),
`decode_rows(codes, params, out, work)` writes code * step + lo (step = (hi - lo) / 255 from the
rows' float16 params, lo[0..P*T) then hi) into a float32 or bfloat16-bits (uint16) (P, T, D)
destination, which may be a strided view of a larger cache; `work` is a kv_int8.encode.Scratch.
Every float operation is the reference's, in float32, in its order, without FMA: the decoded values
are bit-identical (tests/nodes/engines/kernels/kv_int8/test_encode_decode.py). Rows of 64 or 128
run on kv_int8.vectors' hand-built vector code. Into float32, rows that start on 64-byte lines
(`can_stream(out)`: an engine's cache) are written with streaming stores, fenced before returning.
`warmup()` compiles the decoders.

Why streaming stores: they skip reading each line in before overwriting it, a large share of a
transfer's memory traffic with a float32 cache, and leave the caches' contents in place.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.jit import inline_plain as _inline
from nodes.engines.kernels.jit import njit_plain as _njit
from nodes.engines.kernels.kv_int8.encode import AVAILABLE, Scratch

if AVAILABLE:
    from nodes.engines.kernels.kv_int8.encode import _float16_value
    from nodes.engines.kernels.kv_int8.vectors import make_row_decode_bf16, make_row_decode_f32, store_fence

    _DECODE_BF16_64, _DECODE_BF16_128 = make_row_decode_bf16(64), make_row_decode_bf16(128)
    _DECODE_F32_64, _DECODE_F32_128 = make_row_decode_f32(64), make_row_decode_f32(128)


@_inline
def _row_params(codes, params, p, t):  # pragma: no cover - runs compiled
    """(lo, step) of row (p, t): its float16 lo and hi from the params' two halves."""
    row, num_rows = p * codes.shape[1] + t, codes.shape[0] * codes.shape[1]
    low = _float16_value(params[row])
    return low, (_float16_value(params[num_rows + row]) - low) / np.float32(255.0)


@_njit
def _decode_f32(codes, params, out, streaming):  # pragma: no cover - runs compiled
    width = codes.shape[2]
    for p in range(codes.shape[0]):
        for t in range(codes.shape[1]):
            low, step = _row_params(codes, params, p, t)
            if streaming and width == 64:
                _DECODE_F32_64(codes, p, t, low, step, out)
                continue
            if streaming and width == 128:
                _DECODE_F32_128(codes, p, t, low, step, out)
                continue
            for j in range(width):
                out[p, t, j] = np.float32(codes[p, t, j]) * step + low
    if streaming:
        store_fence()   # streaming stores are weakly ordered: visible before anyone is told


@_njit
def _decode_bf16(codes, params, out, row, row_bits):  # pragma: no cover - runs compiled
    width = codes.shape[2]
    for p in range(codes.shape[0]):
        for t in range(codes.shape[1]):
            low, step = _row_params(codes, params, p, t)
            if width == 64:
                _DECODE_BF16_64(codes, p, t, low, step, out)
                continue
            if width == 128:
                _DECODE_BF16_128(codes, p, t, low, step, out)
                continue
            for j in range(codes.shape[2]):
                row[0, j] = np.float32(codes[p, t, j]) * step + low
            for j in range(codes.shape[2]):   # to bfloat16: round to nearest even (finite values)
                b = row_bits[0, j]
                out[p, t, j] = np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


def can_stream(out: np.ndarray) -> bool:
    """Whether float32 rows can take streaming stores: every row contiguous and starting on a
    64-byte line (a streaming store writes 16 floats, a whole line, and needs its alignment)."""
    return (out.dtype == np.float32 and out.ctypes.data % 64 == 0 and out.strides[-1] == 4
            and all(stride % 64 == 0 for stride in out.strides[:-1]))


def decode_rows(codes: np.ndarray, params: np.ndarray, out: np.ndarray, work: Scratch) -> None:
    """uint8 codes (P, T, D), params (2*P*T,) float16 bits -> out (P, T, D): float32, or uint16
    bfloat16 bits."""
    if out.dtype == np.float32:
        _decode_f32(codes, params, out, AVAILABLE and can_stream(out))
        return
    if work.row.shape[1] != codes.shape[2]:
        work.row = np.empty((1, codes.shape[2]), np.float32)
    _decode_bf16(codes, params, out, work.row, work.row.view(np.uint32))


def warmup() -> None:
    """Compile (or load from the disk cache) the decoders into float32 and bf16 rows of 64."""
    codes, params = np.zeros((1, 16, 64), np.uint8), np.zeros(32, np.uint16)
    for dtype in (np.float32, np.uint16):
        decode_rows(codes, params, np.empty((1, 16, 64), dtype), Scratch(64))
