"""bf16 linear layers of decode steps on AMX tiles: the norm before and the epilogue after
`amx_tiles.matmul`, with the roundings of linear.dot_bf16 and of torch's oneDNN path.

Contract (only where `amx_tiles.AVAILABLE`, i.e. `kernels.cpu.probe().amx`; bf16 values as uint16
bit patterns; x has 1-32 rows; `x_pad` is uint16 scratch [16 or 32, K] with at least x's rows,
`acc` float32 [x_pad rows, N], both best from `amx_tiles.aligned_zeros`; weights are
`amx_tiles.pack`ed):
- `norm_linear(x, norm_w, eps, w, x_pad, acc, out)`: out = RMSNorm(x) @ w.T;
- `linear_add(x, w, residual, x_pad, acc, out)`: out = residual + x @ w.T (out may be residual);
- `norm_swiglu(x, norm_w, eps, w_gate, w_up, x_pad, acc, acc_up, out)`:
  out = silu(h @ w_gate.T) * (h @ w_up.T), h = RMSNorm(x).
Roundings: the norm as kernels.bf16_scalar's (bf16 after the scale and after the weight), one
rounding of each product's float32 sum (after the residual add, if any), silu rounded before the
gating product. silu uses the vectorised exp (within 5e-7 of libm's), not a libm call per value: at
32 rows a step has millions of them. `warmup()` compiles them.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels import amx_tiles

if amx_tiles.AVAILABLE:
    from nodes.engines.kernels.bf16_scalar import (
        _bf16_bits,
        _norm_rows_bits,
        _round,
        _silu_vectorised,
        _to_f32,
    )
    from nodes.engines.kernels.jit import njit_numpy_errors as _njit_numpy_errors

    matmul = amx_tiles.matmul

    @_njit_numpy_errors
    def norm_linear(x, norm_w, eps, w, x_pad, acc, out):  # pragma: no cover - runs compiled
        _norm_rows_bits(x, norm_w, eps, x_pad)
        matmul(x_pad, w, acc)
        for m in range(x.shape[0]):
            for n in range(out.shape[1]):
                out[m, n] = _bf16_bits(acc[m, n])

    @_njit_numpy_errors
    def linear_add(x, w, residual, x_pad, acc, out):  # pragma: no cover - runs compiled
        x_pad[:x.shape[0]] = x
        matmul(x_pad, w, acc)
        for m in range(x.shape[0]):
            for n in range(out.shape[1]):
                out[m, n] = _bf16_bits(acc[m, n] + _to_f32(residual[m, n]))

    @_njit_numpy_errors
    def norm_swiglu(x, norm_w, eps, w_gate, w_up, x_pad, acc, acc_up, out):  # pragma: no cover - runs compiled
        _norm_rows_bits(x, norm_w, eps, x_pad)
        matmul(x_pad, w_gate, acc)
        matmul(x_pad, w_up, acc_up)
        for m in range(x.shape[0]):
            for n in range(out.shape[1]):
                out[m, n] = _bf16_bits(acc_up[m, n] * _round(_silu_vectorised(acc[m, n])))


def warmup() -> None:
    """Compile (or load from the disk cache) the three kernels for the array types fast_path passes."""
    amx_tiles.warmup()
    k, n = amx_tiles.TILE_K, 2 * amx_tiles.TILE_ROWS
    x = np.zeros((1, k), np.uint16)
    w = amx_tiles.pack(np.zeros((n, k), np.uint16))
    x_pad = np.zeros((amx_tiles.TILE_ROWS, k), np.uint16)
    acc = np.zeros((amx_tiles.TILE_ROWS, n), np.float32)
    out = np.zeros((1, n), np.uint16)
    norm_linear(x, x[0], 1e-5, w, x_pad, acc, out)
    linear_add(x, w, out, x_pad, acc, out)
    norm_swiglu(x, x[0], 1e-5, w, w, x_pad, acc, acc.copy(), out)
