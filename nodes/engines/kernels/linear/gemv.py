"""numba GEMV kernels for bf16 decode steps: a few token rows against bf16 weight matrices.

Contract: `AVAILABLE` is `kernels.cpu.probe().numba` (any CPU the kernels compile for); without it
nothing here may be called. Arrays are numpy: bf16 values travel as their uint16 bit patterns
(numpy has no bfloat16), rows [M, K] against weights [N, K] ([out, in], as torch stores them),
outputs uint16 [M, N]; any M, though kernels.dispatch gives them at most GEMV_MAX_ROWS rows.
- `linear(x, w, out)`: out = x @ w.T;
- `norm_linear(x, norm_w, eps, w, out)`: RMSNorm(x) @ w.T;
- `linear_add(x, w, residual, out)`: residual + x @ w.T (`out` may be `residual`: each value is read
  before it is written);
- `norm_swiglu(x, norm_w, eps, w_gate, w_up, out)`: silu(h @ w_gate.T) * (h @ w_up.T), h = RMSNorm(x).
`warmup()` compiles them all (seconds on first use; cached on disk after).
Numerics: products accumulate in float32 (LLVM vectorises the row dot under fast-math
reassociation) and every result is rounded to bf16 with kernels.bf16_scalar's roundings, where
torch's oneDNN path rounds: after the norm's scale and weight, after silu, after the gating
product, once after a fused residual add. So the two paths differ only by float32 summation order.

Why: at one to a few rows a linear layer is a matrix-vector product bound by reading the weights,
and a call has little fixed cost here. Each matrix is read as two streams (its two halves side by
side: more reads in flight than one stream) with the rows PREFETCH_ROWS ahead requested, and 2-4
rows share one pass over each weight row (four accumulators). docs/KERNELS.md has the measured gain
over compiled torch (`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.cpu import probe
from nodes.engines.kernels.jit import inline as _inline
from nodes.engines.kernels.jit import njit as _njit

# Weight rows a GEMV requests ahead of the one it reads: with the hardware prefetcher alone, cold
# weights streamed well below the read bandwidth.
PREFETCH_ROWS = 2
AVAILABLE = probe().numba

if AVAILABLE:
    from nodes.engines.kernels.bf16_scalar import (
        _bf16_bits,
        _load_rows,
        _norm_rows,
        _prefetch_ahead,
        _round,
        _silu,
        _to_f32,
    )

    @_inline
    def _dot(xf, m, w, o):  # pragma: no cover - runs compiled
        acc = np.float32(0.0)
        for k in range(w.shape[1]):
            acc += xf[m, k] * _to_f32(w[o, k])
        return acc

    @_inline
    def _dots(xf, w, o, sums):  # pragma: no cover - runs compiled
        """sums[m] = xf[m] . w[o] for the rows of xf: one pass over w[o] whatever the rows (xf of 2-4
        rows comes zero-padded to 4: four accumulators), so each weight is widened once, not once
        a row."""
        if xf.shape[0] == 4:
            a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
            for k in range(w.shape[1]):
                wk = _to_f32(w[o, k])
                a0 += xf[0, k] * wk
                a1 += xf[1, k] * wk
                a2 += xf[2, k] * wk
                a3 += xf[3, k] * wk
            sums[0], sums[1], sums[2], sums[3] = a0, a1, a2, a3
            return
        for m in range(xf.shape[0]):
            sums[m] = _dot(xf, m, w, o)

    @_inline
    def _widened(x):  # pragma: no cover - runs compiled
        """float32 scratch for x's rows: 2-4 rows padded with zero rows to 4 (see _dots)."""
        rows = 4 if 1 < x.shape[0] <= 4 else x.shape[0]
        return np.zeros((rows, x.shape[1]), np.float32)

    @_inline
    def _outputs(xf, w, o, residual, add, out, sums):  # pragma: no cover - runs compiled
        _dots(xf, w, o, sums)
        for m in range(out.shape[0]):
            value = sums[m]
            out[m, o] = _bf16_bits(value + _to_f32(residual[m, o]) if add else value)

    @_inline
    def _gemv(xf, w, residual, add, out):  # pragma: no cover - runs compiled
        """out = xf @ w.T (+ residual), reading w as two streams (its two halves side by side): with
        two sequential streams the hardware keeps more requests in flight than with one."""
        n = w.shape[0]
        half = (n + 1) // 2
        sums = np.empty(xf.shape[0], np.float32)
        for o in range(half):
            second = o + half
            _prefetch_ahead(w, o, PREFETCH_ROWS)
            if second < n:
                _prefetch_ahead(w, second, PREFETCH_ROWS)
            _outputs(xf, w, o, residual, add, out, sums)
            if second < n:
                _outputs(xf, w, second, residual, add, out, sums)

    @_njit
    def linear(x, w, out):  # pragma: no cover - runs compiled
        xf = _widened(x)
        _load_rows(x, xf)
        _gemv(xf, w, out, False, out)

    @_njit
    def norm_linear(x, norm_w, eps, w, out):  # pragma: no cover - runs compiled
        xf = _widened(x)
        _norm_rows(x, norm_w, eps, xf)
        _gemv(xf, w, out, False, out)

    @_njit
    def linear_add(x, w, residual, out):  # pragma: no cover - runs compiled
        xf = _widened(x)
        _load_rows(x, xf)
        _gemv(xf, w, residual, True, out)

    @_inline
    def _gated(xf, w_gate, w_up, o, out, gates, ups):  # pragma: no cover - runs compiled
        _dots(xf, w_gate, o, gates)
        _dots(xf, w_up, o, ups)
        for m in range(out.shape[0]):
            out[m, o] = _bf16_bits(ups[m] * _round(_silu(gates[m])))

    @_njit
    def norm_swiglu(x, norm_w, eps, w_gate, w_up, out):  # pragma: no cover - runs compiled
        """Four weight streams: both halves of gate and of up, as _gemv reads two."""
        xf = _widened(x)
        _norm_rows(x, norm_w, eps, xf)
        n = w_gate.shape[0]
        half = (n + 1) // 2
        gates, ups = np.empty(xf.shape[0], np.float32), np.empty(xf.shape[0], np.float32)
        for o in range(half):
            second = o + half
            _prefetch_ahead(w_gate, o, PREFETCH_ROWS)
            _prefetch_ahead(w_up, o, PREFETCH_ROWS)
            if second < n:
                _prefetch_ahead(w_gate, second, PREFETCH_ROWS)
                _prefetch_ahead(w_up, second, PREFETCH_ROWS)
            _gated(xf, w_gate, w_up, o, out, gates, ups)
            if second < n:
                _gated(xf, w_gate, w_up, second, out, gates, ups)


def warmup() -> None:
    """Compile (or load from the disk cache) every kernel for the array types the runner passes."""
    x = np.zeros((1, 8), np.uint16)
    w = np.zeros((4, 8), np.uint16)
    out = np.zeros((1, 4), np.uint16)
    linear(x, w, out)
    norm_linear(x, x[0], 1e-5, w, out)
    linear_add(x, w, out, out)
    norm_swiglu(x, x[0], 1e-5, w, w, out)
