"""bf16 GEMVs on AVX512-BF16's pair dot product (vdpbf16ps), for CPUs that have it but no AMX tiles.

Contract: `AVAILABLE` holds where numba is importable and the CPU has AVX512-BF16 (detected as
attention_rows detects it); `can_run(width)` where a matrix's input width is a multiple of 32 (one
64-byte vector of bf16 pairs). The four kernels take the arguments of bf16_kernels' namesakes and
round where they round (after the norm's scale and weight, after silu, after the gating product,
once after a fused residual add): `linear(x, w, out)`, `norm_linear(x, norm_w, eps, w, out)`,
`linear_add(x, w, residual, out)`, `norm_swiglu(x, norm_w, eps, w_gate, w_up, out)`, for any
number of rows. Their results differ from bf16_kernels' only by float32 summation order (and
vdpbf16ps treats float32 denormals as zero, far below any weight or activation of a model).
`warmup()` compiles them (seconds on first use; cached on disk after); it raises where they cannot
be built, and Bf16Gemv then keeps bf16_kernels.

How: the rows, already bf16 values (RMSNorm's output is rounded to bf16; other inputs are bf16
tensors), go zero-padded into a [1, 2, 4 or 8k, width] bf16 block. Each call of the block kernel
reads two weight rows (o and o + half of one matrix, or row o of gate and of up) for every row of a
block of up to 8, 32 bf16 at a load, and vdpbf16ps multiplies the pairs into 16 float32 lanes per
sum: no widening of the weights, which bf16_kernels pays on every value. At one or two rows each
sum is split over even and odd vectors (a vdpbf16ps waits on its accumulator), so a row's float32
summation order depends on how many rows its step has.

Why: a Zen 4 without AMX ran bf16_kernels' linear layers of a SmolLM2 decode step in 17-18 ms at
one row (12-21 GB/s) and 34 ms at four, compute-bound on the widening; this kernel takes 9.4-9.7,
16.6 and 22 ms at one, four and eight rows (ad-hoc timing over cold weights; `make bench-engine`
measures whole steps).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.attention_rows import AVAILABLE

LANES = 32          # bf16 values one vdpbf16ps reads from each operand
BLOCK_ROWS = 8      # rows sharing a pass over two weight rows: 16 accumulators of 32 vector registers


def can_run(width: int) -> bool:
    return AVAILABLE and width > 0 and width % LANES == 0


def padded_rows(rows: int) -> int:
    """Rows of the bf16 block for `rows` inputs: 1, 2, 4 or a multiple of 8."""
    if rows <= 2:
        return rows
    if rows <= 4:
        return 4
    return -(-rows // BLOCK_ROWS) * BLOCK_ROWS


if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from bus.numba_vectors import F32, VF, VI32, dpbf16, item
    from nodes.engines.bf16_kernels import (
        _bf16_bits,
        _inline,
        _njit,
        _norm_scale,
        _normed,
        _round,
        _silu,
        _to_f32,
    )

    def _block_dot(num_rows: int):
        """An intrinsic `(xb, r, w, o, v, p, sums)`: sums[0, r + m] = xb[r + m] . w[o] and
        sums[1, r + m] = xb[r + m] . v[p] for m < num_rows, the width a multiple of LANES. One load of
        32 weights serves every row; two weight rows at once (two streams from memory, twice the
        independent sums), and for one or two rows each sum split over even and odd vectors: a
        vdpbf16ps waits ~6 cycles on its accumulator, so one chain a row left the core idle."""
        ways = 2 if num_rows <= 2 else 1

        @intrinsic
        def block_dot(typingctx, xb, r, w, o, v, p, sums):
            def codegen(context, builder, signature, args):
                xb_type, _, w_type, _, v_type, _, sums_type = signature.args
                intp = context.get_value_type(types.intp)
                zero = ir.Constant(intp, 0)
                pointer = ir.PointerType(VI32)
                weights = [builder.bitcast(item(context, builder, w_type, args[2], [args[3], zero]), pointer),
                           builder.bitcast(item(context, builder, v_type, args[4], [args[5], zero]), pointer)]
                rows = [builder.add(args[1], ir.Constant(intp, m)) for m in range(num_rows)]
                inputs = [builder.bitcast(item(context, builder, xb_type, args[0], [row, zero]), pointer)
                          for row in rows]
                accs = [[[cgutils.alloca_once_value(builder, ir.Constant(VF, None)) for _ in range(ways)]
                         for _ in rows] for _ in weights]

                def step(vector, way):
                    pairs = [builder.load(builder.gep(w_row, [vector]), align=2) for w_row in weights]
                    for m, row_input in enumerate(inputs):
                        x_pairs = builder.load(builder.gep(row_input, [vector]), align=2)
                        for i, w_pairs in enumerate(pairs):
                            acc = accs[i][m][way]
                            builder.store(dpbf16(builder, builder.load(acc), x_pairs, w_pairs), acc)

                width = builder.extract_value(context.make_array(w_type)(context, builder, args[2]).shape, 1)
                vectors = builder.udiv(width, ir.Constant(intp, LANES))
                with cgutils.for_range(builder, builder.udiv(vectors, ir.Constant(intp, ways))) as loop:
                    first = builder.mul(loop.index, ir.Constant(intp, ways))
                    for way in range(ways):
                        step(builder.add(first, ir.Constant(intp, way)), way)
                if ways == 2:   # an odd number of vectors: the last one
                    odd = builder.urem(vectors, ir.Constant(intp, 2))
                    with builder.if_then(builder.icmp_unsigned("!=", odd, zero)):
                        step(builder.sub(vectors, ir.Constant(intp, 1)), 0)
                reduce = cgutils.get_or_insert_function(builder.module, ir.FunctionType(F32, [F32, VF]),
                                                        "llvm.vector.reduce.fadd.v16f32")
                for i in range(len(weights)):
                    for m, row in enumerate(rows):
                        total = builder.load(accs[i][m][0])
                        for way in range(1, ways):
                            total = builder.fadd(total, builder.load(accs[i][m][way]), flags=("reassoc",))
                        total = builder.call(reduce, [ir.Constant(F32, -0.0), total], fastmath=("reassoc",))
                        builder.store(total, item(context, builder, sums_type, args[6], [ir.Constant(intp, i), row]))
                return context.get_dummy_value()
            return types.none(xb, r, w, o, v, p, sums), codegen
        return block_dot

    _dot1, _dot2, _dot4, _dot8 = (_block_dot(n) for n in (1, 2, 4, BLOCK_ROWS))

    @_inline
    def _dots(xb, w, o, v, p, sums):  # pragma: no cover - runs compiled
        """sums[0, m] = xb[m] . w[o], sums[1, m] = xb[m] . v[p] for every row of xb."""
        rows = xb.shape[0]
        if rows == 1:
            _dot1(xb, 0, w, o, v, p, sums)
        elif rows == 2:
            _dot2(xb, 0, w, o, v, p, sums)
        elif rows == 4:
            _dot4(xb, 0, w, o, v, p, sums)
        else:
            for r in range(0, rows, BLOCK_ROWS):
                _dot8(xb, r, w, o, v, p, sums)

    _padded_rows = _inline(padded_rows)

    @_inline
    def _block(x):  # pragma: no cover - runs compiled
        return np.zeros((_padded_rows(x.shape[0]), x.shape[1]), np.uint16)

    @_inline
    def _copy_rows(x, xb):  # pragma: no cover - runs compiled
        for m in range(x.shape[0]):
            for k in range(x.shape[1]):
                xb[m, k] = x[m, k]

    @_inline
    def _norm_rows(x, norm_w, eps, xb):  # pragma: no cover - runs compiled
        """RMSNorm of x's rows (bf16 values, so their bits are exact) into xb."""
        for m in range(x.shape[0]):
            scale = _norm_scale(x, m, eps)
            for k in range(x.shape[1]):
                xb[m, k] = _bf16_bits(_normed(x, m, k, norm_w, scale))

    @_inline
    def _store(sums, i, o, residual, add, out):  # pragma: no cover - runs compiled
        for m in range(out.shape[0]):
            value = sums[i, m]
            out[m, o] = _bf16_bits(value + _to_f32(residual[m, o]) if add else value)

    @_inline
    def _gemv(xb, w, residual, add, out):  # pragma: no cover - runs compiled
        """out = xb @ w.T (+ residual): outputs o and o + half together (w's two halves side by side)."""
        n = w.shape[0]
        half = (n + 1) // 2
        sums = np.empty((2, xb.shape[0]), np.float32)
        for o in range(half):
            second = o + half if o + half < n else o
            _dots(xb, w, o, w, second, sums)
            _store(sums, 0, o, residual, add, out)
            if second != o:
                _store(sums, 1, second, residual, add, out)

    @_njit
    def linear(x, w, out):  # pragma: no cover - runs compiled
        xb = _block(x)
        _copy_rows(x, xb)
        _gemv(xb, w, out, False, out)

    @_njit
    def norm_linear(x, norm_w, eps, w, out):  # pragma: no cover - runs compiled
        xb = _block(x)
        _norm_rows(x, norm_w, eps, xb)
        _gemv(xb, w, out, False, out)

    @_njit
    def linear_add(x, w, residual, out):  # pragma: no cover - runs compiled
        xb = _block(x)
        _copy_rows(x, xb)
        _gemv(xb, w, residual, True, out)

    @_njit
    def norm_swiglu(x, norm_w, eps, w_gate, w_up, out):  # pragma: no cover - runs compiled
        xb = _block(x)
        _norm_rows(x, norm_w, eps, xb)
        sums = np.empty((2, xb.shape[0]), np.float32)
        for o in range(w_gate.shape[0]):   # gate and up rows o together: two streams, as _gemv reads
            _dots(xb, w_gate, o, w_up, o, sums)
            for m in range(out.shape[0]):
                out[m, o] = _bf16_bits(sums[1, m] * _round(_silu(sums[0, m])))


def warmup() -> None:
    """Compile (or load from the disk cache) the kernels for the array types the runner passes."""
    if not AVAILABLE:
        raise RuntimeError("the CPU has no AVX512-BF16 (or numba is missing)")
    w = np.zeros((4, LANES), np.uint16)
    for rows in (1, 2, 3, 9):
        x = np.zeros((rows, LANES), np.uint16)
        out = np.zeros((rows, 4), np.uint16)
        linear(x, w, out)
        norm_linear(x, x[0], 1e-5, w, out)
        linear_add(x, w, out, out)
        norm_swiglu(x, x[0], 1e-5, w, w, out)
