"""numba GEMV kernels for bf16 decode steps: a few token rows against bf16 weight matrices.

Contract: `AVAILABLE` says whether numba is importable; without it nothing here may be called.
Arrays are numpy: bf16 values travel as their uint16 bit patterns (numpy has no bfloat16), rows
[M, K] against weights [N, K] ([out, in], as torch stores them), outputs uint16 [M, N].
- `linear(x, w, out)`: out = x @ w.T;
- `norm_linear(x, norm_w, eps, w, out)`: RMSNorm(x) @ w.T;
- `linear_add(x, w, residual, out)`: residual + x @ w.T;
- `norm_swiglu(x, norm_w, eps, w_gate, w_up, out)`: silu(h @ w_gate.T) * (h @ w_up.T), h = RMSNorm(x).
(The decode attention kernel, which shares this module's bf16 helpers, is nodes/engines/bf16_attention.py.)
`warmup()` compiles them all (seconds on first use; cached on disk after).

Why: at one to a few rows a linear layer is a matrix-vector product bound by reading the weights.
oneDNN's packed bf16 kernels read them at 7-13 GB/s on this machine's layer shapes and pay about
25 us a call; these loops pay ~6 us a call and stream cold weights at about the single-core read
bandwidth: each matrix is read as two streams (its two halves side by side) with the rows two
ahead requested (`_prefetch`), and 2-4 rows share one pass over each weight row (four
accumulators). harness.bench.engine_bench measures the whole step against the bandwidth floor.
Products accumulate in float32 (LLVM vectorises the row dot under fast-math reassociation) and
every result is rounded to bf16 where the oneDNN path rounds: after the norm's scale and weight,
after silu, after the gating product, once after a fused residual add. So the two paths differ
only by float32 summation order.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # the oneDNN path serves every step without it
    numba = None

AVAILABLE = numba is not None
FASTMATH = {"reassoc", "contract"}   # vectorised float32 reductions, FMA; no unsafe NaN/inf folding
# Weight rows a GEMV requests ahead of the one it reads (2.3 KB at SmolLM2's width): with the
# hardware prefetcher alone, cold weights streamed well below the read bandwidth.
PREFETCH_ROWS = 2


def _njit(function):
    return numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)(function)


def _njit_numpy_errors(function):
    """_njit with numpy's error model: a float division in a loop gets no zero-divisor check
    (numba's default raises ZeroDivisionError, and that branch kept the AMX silu epilogue scalar:
    250 vs 41 us for 32 x 1536 values)."""
    return numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH, error_model="numpy")(function)


def _inline(function):
    return numba.njit(inline="always", boundscheck=False, fastmath=FASTMATH)(function)


if AVAILABLE:
    @intrinsic
    def _to_f32(typingctx, bits):
        """bf16 bits (uint16) -> float32: the bits are float32's upper half."""
        def codegen(context, builder, signature, args):
            wide = builder.zext(args[0], ir.IntType(32))
            return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())
        return types.float32(types.uint16), codegen

    from bus.numba_bits import bits_f32 as _bits_f32

    @intrinsic
    def _prefetch(typingctx, array, i, j):
        """Ask for the cache line holding array[i, j] (a 2-D array), for reading, into every level."""
        def codegen(context, builder, signature, args):
            array_type = signature.args[0]
            data = context.make_array(array_type)(context, builder, args[0])
            pointer = cgutils.get_item_pointer(context, builder, array_type, data, [args[1], args[2]],
                                               wraparound=False, boundscheck=False)
            byte_pointer = ir.PointerType(ir.IntType(8))
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), [byte_pointer] + [ir.IntType(32)] * 3), "llvm.prefetch.p0")
            flags = [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)]   # read, keep, data cache
            builder.call(function, [builder.bitcast(pointer, byte_pointer), *flags])
            return context.get_dummy_value()
        return types.none(array, i, j), codegen

    from bus.numba_bits import bf16_bits as _bf16_bits  # float32 -> bf16 bits, nearest even
    from bus.numba_bits import bf16_round as _round  # float32 -> nearest bf16 value, as float32

    @_inline
    def _load_rows(x, xf):  # pragma: no cover - runs compiled
        for m in range(x.shape[0]):
            for k in range(x.shape[1]):
                xf[m, k] = _to_f32(x[m, k])

    @_inline
    def _norm_scale(x, m, eps):  # pragma: no cover - runs compiled
        """llama.rms_norm's bf16 branch for row m: float32 statistics, the scale rounded to bf16."""
        squares = np.float32(0.0)
        for k in range(x.shape[1]):
            v = _to_f32(x[m, k])
            squares += v * v
        return _scale_of_squares(squares, x.shape[1], eps)

    @_inline
    def _scale_of_squares(squares, width, eps):  # pragma: no cover - runs compiled
        """The bf16 RMSNorm scale of a row from the float32 sum of its squares."""
        return _round(np.float32(1.0) / np.sqrt(squares / np.float32(width) + np.float32(eps)))

    @_inline
    def _normed(x, m, k, norm_w, scale):  # pragma: no cover - runs compiled
        """x[m, k] after RMSNorm (scale from _norm_scale), rounded twice as llama.rms_norm's bf16
        branch rounds it: after the scale, after the weight. Every bf16 norm kernel uses this."""
        return _round(_round(_to_f32(x[m, k]) * scale) * _to_f32(norm_w[k]))

    @_inline
    def _norm_rows(x, norm_w, eps, xf):  # pragma: no cover - runs compiled
        """RMSNorm of x's rows into float32 xf."""
        for m in range(x.shape[0]):
            scale = _norm_scale(x, m, eps)
            for k in range(x.shape[1]):
                xf[m, k] = _normed(x, m, k, norm_w, scale)

    @_inline
    def _norm_rows_bits(x, norm_w, eps, out):  # pragma: no cover - runs compiled
        """RMSNorm of x's rows into bf16 bits (llama.rms_norm's bf16 output, bit for bit)."""
        for m in range(x.shape[0]):
            scale = _norm_scale(x, m, eps)
            for k in range(x.shape[1]):
                out[m, k] = _bf16_bits(_normed(x, m, k, norm_w, scale))

    @_inline
    def _rope_pair(qkv, m, base, d, half, cos, sin, pos):  # pragma: no cover - runs compiled
        """Values d and d + half of the head at qkv[m, base:] after RoPE, with x * cos rounded as
        llama.apply_rope rounds it (rotate-half tables, its sign in sin); the caller rounds the sums."""
        a, b = _to_f32(qkv[m, base + d]), _to_f32(qkv[m, base + d + half])
        return (_round(a * _to_f32(cos[pos, d])) + b * _to_f32(sin[pos, d]),
                _round(b * _to_f32(cos[pos, d + half])) + a * _to_f32(sin[pos, d + half]))

    @_inline
    def _prefetch_ahead(rows, j, ahead):  # pragma: no cover - runs compiled
        """Request row j + ahead of a 2-D array, if it has one."""
        if j + ahead < rows.shape[0]:
            for c in range(0, rows.shape[1], 32):   # a cache line holds 32 bf16 values
                _prefetch(rows, j + ahead, c)

    @_inline
    def _dot(xf, m, w, o):  # pragma: no cover - runs compiled
        acc = np.float32(0.0)
        for k in range(w.shape[1]):
            acc += xf[m, k] * _to_f32(w[o, k])
        return acc

    @_inline
    def _dots(xf, w, o, sums):  # pragma: no cover - runs compiled
        """sums[m] = xf[m] . w[o] for the rows of xf: one pass over w[o] whatever the rows (xf of 2-4
        rows comes zero-padded to 4: four accumulators; each row its own pass re-widened every
        weight, which made a 4-row step ~1.9x a 1-row one)."""
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
    def _silu(value):  # pragma: no cover - runs compiled
        return value / (np.float32(1.0) + np.exp(-value))

    @_inline
    def _exp_nonpositive(x):  # pragma: no cover - runs compiled
        """exp(x) for x <= 0: 2**n * p(r), x = n ln2 + r (Cody-Waite), p a degree-7 Taylor series."""
        x = x if x > np.float32(-87.0) else np.float32(-87.0)   # below: 0 to float32's precision
        n = np.float32(np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5)))
        r = x - n * np.float32(0.693145751953125)
        r = r - n * np.float32(1.428606765330187e-06)
        p = np.float32(1.0 / 720.0)
        for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
            p = p * r + np.float32(c)
        return p * _bits_f32(np.uint32(np.int32(n) + np.int32(127)) << np.uint32(23))

    @_inline
    def _silu_vectorised(value):  # pragma: no cover - runs compiled
        """silu with `_exp_nonpositive` (np.exp is a libm call per value): e = exp(-|v|) <= 1,
        silu = v / (1 + e) for v >= 0 and v * e / (1 + e) below; no branch, so loops vectorise."""
        e = _exp_nonpositive(-abs(value))
        inverse = np.float32(1.0) / (np.float32(1.0) + e)
        return value * (inverse if value >= np.float32(0.0) else e * inverse)

    @_inline
    def _outputs(xf, w, o, residual, add, out, sums):  # pragma: no cover - runs compiled
        _dots(xf, w, o, sums)
        for m in range(out.shape[0]):
            value = sums[m]
            out[m, o] = _bf16_bits(value + _to_f32(residual[m, o]) if add else value)

    @_inline
    def _gemv(xf, w, residual, add, out):  # pragma: no cover - runs compiled
        """out = xf @ w.T (+ residual), reading w as two streams (its two halves side by side): one
        sequential stream got 9.8-10.6 GB/s from memory on qkv/o shapes, two 13.2-13.7 (ad-hoc
        microbenchmark, cold weights); the hardware has more requests in flight."""
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
