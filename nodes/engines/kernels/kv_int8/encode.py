"""Single-pass numba kernels of the `int8` mode (per-token asymmetric), on numpy arrays.

Contract: `AVAILABLE` is llvm_bits.AVAILABLE (`kernels.cpu.probe().numba`); without it nothing here
may be called. `encode_rows(rows, codes, params, work)` quantizes float32 rows (R, D) into uint8 codes
(R, D) and the rows' params, float16 bit patterns (uint16, 2R) lo[0..R) then hi[0..R), bus.kv.quant's
frame 1; `encode_bf16_rows` does the same from bfloat16 bits (uint16). Both return False, leaving
their outputs partly written, when a row holds a NaN or infinity or its range does not fit float16:
the caller then takes the numpy reference path (bus.kv.quant), which raises or falls back to float32
params. Decoding is kv_int8.decode's (`decode_rows`). `work = Scratch(head_dim)` holds the per-call
scratch arrays (not thread-safe: one per caller). `warmup()` compiles both encoders.
Numerics: every float operation is bus.kv.quant's, in its order and in float32, without FMA
contraction (kernels.jit's plain decorators), so codes, params and decoded values are bit-identical
to the numpy reference (tests/nodes/engines/kernels/kv_int8/test_encode_decode.py). numba has no
float16 on CPU, so the params are rounded and converted on the bits: to nearest even at float16's
mantissa width, float16's subnormal step below 2**-14, "does not fit" from 65520 (which rounds to
infinity).

Why one pass: the row min/max, the params and the codes are computed while the row sits in L1, so
each value is read from memory once (ATen reductions plus a quantize kernel need three passes); the
NaN/inf check is summed in lanes and tested once per call, and float<->bits goes through LLVM
bitcasts (llvm_bits), not a store and a load. Rows of 64 or 128 values (most models' head_dim) run
on kv_int8.vectors' hand-built code, with the params of LANES rows at a time in one loop that LLVM
vectorises across rows; from a cold cache the encode is bound by reading it, so it requests each
row's lines PREFETCH_ROWS rows ahead. docs/KERNELS.md has the measured gain over compiled torch
(`make bench-engine`).
"""

from __future__ import annotations

import math

import numpy as np

from nodes.engines.kernels import llvm_bits
from nodes.engines.kernels.jit import inline_plain as _inline
from nodes.engines.kernels.jit import njit_plain_numpy_errors as _njit_numpy_errors

AVAILABLE = llvm_bits.AVAILABLE
if AVAILABLE:
    from nodes.engines.kernels.kv_int8.vectors import make_prefetch_row, make_row_codes, make_row_range
    _PREFETCH64, _PREFETCH128 = make_prefetch_row(64), make_prefetch_row(128)
    from nodes.engines.kernels.llvm_bits import bits_f32, f32_bits

    # Rows of 64 and 128 values (head_dim of most models) encode on hand-built vector code.
    _RANGE64, _RANGE128 = make_row_range(64), make_row_range(128)
    _CODES64, _CODES128 = make_row_codes(64), make_row_codes(128)
LANES = 16
# Rows the encode asks for ahead of the one it reads (4 KiB of float32 rows of 64): the hardware
# prefetcher alone reads a cold cache well below the memory's rate; the distance is not critical.
PREFETCH_ROWS = 16
OUTWARD = np.float32(2.0**-10)   # bus.kv.quant.OUTWARD
F16_TINY = np.float32(2.0**-24)  # bus.kv.quant.F16_TINY
F16_MAX = np.float32(65504.0)


class Scratch:
    """The small arrays the kernels work in: lanes of the row min/max and of the finiteness check,
    and one float32 row (a bf16 row widened)."""

    def __init__(self, head_dim: int) -> None:
        self.lanes = np.empty((3, LANES), np.float32)
        self.block = np.empty((4, LANES), np.float32)   # a block of rows' lows, highs, starts, inverses
        self.row = np.empty((1, head_dim), np.float32)

    def args(self) -> tuple:
        lanes = self.lanes
        return lanes[0], lanes[1], lanes[2]


@_inline
def _row_range(src, r, mn, mx, ck):  # pragma: no cover - runs compiled
    """(min, max) of row r; adds (x - x) of each value into the lanes of `ck`, which stay 0 unless
    a value is NaN or infinite (the caller checks them once per call, not per row). Heads of 64k
    values take 16 SIMD lanes, reduced as a tree (a 16-step serial min/max would cost a large share
    of the encode); others a scalar loop."""
    width = src.shape[1]
    if width % 64 == 0:
        for k in range(LANES):
            x0, x1, x2, x3 = src[r, k], src[r, k + 16], src[r, k + 32], src[r, k + 48]
            l0, l1 = (x0 if x0 < x1 else x1), (x2 if x2 < x3 else x3)
            h0, h1 = (x0 if x0 > x1 else x1), (x2 if x2 > x3 else x3)
            mn[k], mx[k] = (l0 if l0 < l1 else l1), (h0 if h0 > h1 else h1)
            ck[k] += ((x0 - x0) + (x1 - x1)) + ((x2 - x2) + (x3 - x3))
        for c in range(64, width, 64):
            for k in range(LANES):
                x0, x1, x2, x3 = src[r, c + k], src[r, c + k + 16], src[r, c + k + 32], src[r, c + k + 48]
                l0, l1 = (x0 if x0 < x1 else x1), (x2 if x2 < x3 else x3)
                h0, h1 = (x0 if x0 > x1 else x1), (x2 if x2 > x3 else x3)
                l0, h0 = (l0 if l0 < l1 else l1), (h0 if h0 > h1 else h1)
                mn[k], mx[k] = (l0 if l0 < mn[k] else mn[k]), (h0 if h0 > mx[k] else mx[k])
                ck[k] += ((x0 - x0) + (x1 - x1)) + ((x2 - x2) + (x3 - x3))
        for half in (8, 4, 2, 1):
            for k in range(half):
                a, b = mn[k], mn[k + half]
                mn[k] = a if a < b else b
                a, b = mx[k], mx[k + half]
                mx[k] = a if a > b else b
        return mn[0], mx[0]
    low, high = src[r, 0], src[r, 0]
    for j in range(width):
        x = src[r, j]
        low = x if x < low else low
        high = x if x > high else high
        ck[0] += x - x
    return low, high


@_inline
def _to_float16(value):  # pragma: no cover - runs compiled
    """The float16 nearest to a float32 (ties to even), as a float32; inf when it does not fit."""
    magnitude = abs(value)
    if not magnitude < np.float32(65520.0):
        return np.float32(np.inf)
    if magnitude < np.float32(2.0**-14):   # subnormal: a multiple of 2**-24 (the scaling is exact)
        scaled = value * np.float32(16777216.0)
        rounded = (scaled + np.float32(12582912.0)) - np.float32(12582912.0)   # 1.5 * 2**23: to integer
        return np.float32(math.copysign(rounded * np.float32(2.0**-24), value))
    b = f32_bits(value)
    return bits_f32((b + np.uint32(0xFFF) + ((b >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))


@_inline
def _float16_bits(value):  # pragma: no cover - runs compiled
    """The float16 bit pattern of a float32 that holds a finite float16 value."""
    b = f32_bits(value)
    sign = np.uint16((b >> np.uint32(16)) & np.uint32(0x8000))
    if abs(value) < np.float32(2.0**-14):   # subnormal or zero: an exact multiple of 2**-24
        return sign | np.uint16(np.int32(abs(value) * np.float32(16777216.0)))
    exponent = ((b >> np.uint32(23)) & np.uint32(0xFF)) - np.uint32(112)   # rebias 127 -> 15
    return sign | np.uint16((exponent << np.uint32(10)) | ((b >> np.uint32(13)) & np.uint32(0x3FF)))


@_inline
def _float16_value(h):  # pragma: no cover - runs compiled
    """The float32 value of float16 bits (exact; inf and NaN kept)."""
    h32 = np.uint32(h)
    sign = (h32 & np.uint32(0x8000)) << np.uint32(16)
    exponent = (h32 >> np.uint32(10)) & np.uint32(0x1F)
    mantissa = h32 & np.uint32(0x3FF)
    if exponent == 0:
        magnitude = np.float32(mantissa) * np.float32(2.0**-24)
        return -magnitude if sign else magnitude
    exponent = np.uint32(0xFF) if exponent == 31 else exponent + np.uint32(112)
    return bits_f32(sign | (exponent << np.uint32(23)) | (mantissa << np.uint32(13)))


@_inline
def _rounded_range(low, high):  # pragma: no cover - runs compiled
    """A row's float16 lo/hi (its range rounded outward), whether they fit float16, and 1/step."""
    lo_r = _to_float16(low - (abs(low) * OUTWARD + F16_TINY))
    hi_r = _to_float16(high + (abs(high) * OUTWARD + F16_TINY))
    fits = (abs(lo_r) <= F16_MAX) & (abs(hi_r) <= F16_MAX)
    step = (hi_r - lo_r) / np.float32(255.0)
    return lo_r, hi_r, fits, (np.float32(1.0) / step if step > 0 else np.float32(0.0))


@_inline
def _params(low, high, codes, out_row, params):  # pragma: no cover - runs compiled
    """Row params from its range into params; (ok, lo, 1/step), ok False when it does not fit float16."""
    lo_r, hi_r, fits, inverse = _rounded_range(low, high)
    if not fits:
        return False, lo_r, inverse
    params[out_row] = _float16_bits(lo_r)
    params[codes.shape[0] + out_row] = _float16_bits(hi_r)
    return True, lo_r, inverse


@_inline
def _encode_row(src, r, codes, out_row, params, mn, mx, ck):  # pragma: no cover - runs compiled
    """Row r of src into codes[out_row] and its params; False when its range does not fit float16
    (or holds a NaN or infinity, which the caller's `ck` check also catches)."""
    low, high = _row_range(src, r, mn, mx, ck)
    ok, lo_r, inverse = _params(low, high, codes, out_row, params)
    if not ok:
        return False
    for j in range(src.shape[1]):   # round half up by truncation, as the reference
        scaled = (src[r, j] - lo_r) * inverse + np.float32(0.5)
        codes[out_row, j] = np.uint8(np.int32(min(max(scaled, np.float32(0.0)), np.float32(255.5))))
    return True


@_inline
def _range_vectors(src, r, ck):  # pragma: no cover - runs compiled
    return _RANGE64(src, r, ck) if src.shape[1] == 64 else _RANGE128(src, r, ck)


@_inline
def _codes_vectors(src, r, low, inverse, codes):  # pragma: no cover - runs compiled
    if src.shape[1] == 64:
        _CODES64(src, r, low, inverse, codes, r)
    else:
        _CODES128(src, r, low, inverse, codes, r)


@_inline
def _encode_rows_vectors(src, codes, params, ck, block):  # pragma: no cover - runs compiled
    """Rows of 64 or 128 values (float32 or bf16 bits) on kv_int8.vectors' code, LANES rows at a time:
    their ranges, then their params in one loop that LLVM vectorises across the rows (per row,
    the float16 roundings and their branches cost as much as the whole row's vector code), then
    their codes. False when a row's range does not fit float16."""
    lows, highs, starts, inverses = block[0], block[1], block[2], block[3]
    num_rows = src.shape[0]
    for r0 in range(0, num_rows, LANES):
        count = min(LANES, num_rows - r0)
        for i in range(count):
            ahead = r0 + i + PREFETCH_ROWS
            if ahead < num_rows:
                if src.shape[1] == 64:
                    _PREFETCH64(src, ahead)
                else:
                    _PREFETCH128(src, ahead)
            lows[i], highs[i] = _range_vectors(src, r0 + i, ck)
        fits = 0
        for i in range(count):
            starts[i], highs[i], row_fits, inverses[i] = _rounded_range(lows[i], highs[i])
            fits += row_fits
        if fits != count:
            return False
        for i in range(count):
            params[r0 + i] = _float16_bits(starts[i])
            params[num_rows + r0 + i] = _float16_bits(highs[i])
        for i in range(count):
            _codes_vectors(src, r0 + i, starts[i], inverses[i], codes)
    return True


@_inline
def _all_finite(ck):  # pragma: no cover - runs compiled
    total = np.float32(0.0)
    for k in range(LANES):
        total += ck[k]
    return total == 0


@_njit_numpy_errors
def _encode_f32(rows, codes, params, mn, mx, ck, block):  # pragma: no cover - runs compiled
    ck[:] = 0.0
    if rows.shape[1] == 64 or rows.shape[1] == 128:
        return _encode_rows_vectors(rows, codes, params, ck, block) and _all_finite(ck)
    for r in range(rows.shape[0]):  # noqa: SIM110 - numba compiles no generator into all()
        if not _encode_row(rows, r, codes, r, params, mn, mx, ck):
            return False
    return _all_finite(ck)


@_njit_numpy_errors
def _encode_bf16(rows, codes, params, mn, mx, ck, block, row, row_bits):  # pragma: no cover
    ck[:] = 0.0
    if rows.shape[1] == 64 or rows.shape[1] == 128:
        return _encode_rows_vectors(rows, codes, params, ck, block) and _all_finite(ck)
    for r in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            row_bits[0, j] = np.uint32(rows[r, j]) << np.uint32(16)
        if not _encode_row(row, 0, codes, r, params, mn, mx, ck):
            return False
    return _all_finite(ck)


def encode_rows(rows: np.ndarray, codes: np.ndarray, params: np.ndarray, work: Scratch) -> bool:
    """float32 rows (R, D) -> uint8 codes (R, D) and params (2R,) uint16: float16 bits of lo then hi."""
    return bool(_encode_f32(rows, codes, params, *work.args(), work.block))


def encode_bf16_rows(rows: np.ndarray, codes: np.ndarray, params: np.ndarray, work: Scratch) -> bool:
    """bfloat16 bits (R, D) uint16 -> as encode_rows."""
    if work.row.shape[1] != rows.shape[1]:
        work.row = np.empty((1, rows.shape[1]), np.float32)
    return bool(_encode_bf16(rows, codes, params, *work.args(), work.block, work.row, work.row.view(np.uint32)))


def warmup() -> None:
    """Compile (or load from the disk cache) the encoders for float32 and bf16 rows of 64."""
    for dtype in (np.float32, np.uint16):
        rows = np.zeros((LANES, 64), dtype)
        encode = encode_rows if dtype == np.float32 else encode_bf16_rows
        encode(rows, np.empty((LANES, 64), np.uint8), np.empty(2 * LANES, np.uint16), Scratch(64))
