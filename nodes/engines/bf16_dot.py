"""bf16 linear layers for 1-32 rows on AVX512-BF16's pair dot product (vdpbf16ps), as outer
products over weights packed in pairs, for CPUs that have it but no AMX tiles.

Contract: `AVAILABLE` holds where numba is importable and the CPU has AVX512-BF16 (detected as
attention_rows detects it); `can_run(width)` where a matrix's input width is a multiple of 32.
`pack(w)` turns a bf16 matrix [outputs, inputs] (uint16 bits) into [ceil(outputs / 64), inputs / 2,
64, 2]: for each block of 64 outputs and each pair of inputs (2k, 2k + 1), the 64 outputs' two
weights side by side (outputs past the matrix's are zero). The four kernels take the arguments of
bf16_kernels' namesakes with packed matrices and round where they round (after the norm's scale
and weight, after silu, after the gating product, once after a fused residual add):
`linear(x, w, out)`, `norm_linear(x, norm_w, eps, w, out)`, `linear_add(x, w, residual, out)`,
`norm_swiglu(x, norm_w, eps, w_gate, w_up, out)`, for any number of rows; `out`'s width is the
matrix's true output count. Their results differ from bf16_kernels' only by float32 summation
order (and vdpbf16ps treats float32 denormals as zero, far below any weight or activation of a
model). Every output's sum runs over the input pairs in order whatever the number of rows, so a
row's result does not depend on the rows beside it. `warmup()` compiles them (seconds on first
use; cached on disk after); it raises where they cannot be built, and Bf16Gemv then keeps
bf16_kernels.

How: for a block of 64 outputs and up to `GROUP_ROWS` rows at once, each step over an input pair
loads the block's four vectors of 16 outputs x 2 weights, broadcasts each row's two inputs, and
vdpbf16ps adds the pairs' products into 4 x rows float32 accumulators that stay in registers: 24
products per 10 loads at 6 rows, and no horizontal sums (each lane is one output). A block (72 KB
at 576 inputs) comes from memory for the first group of rows and from L2 for the others.

Why: the GEMVs this replaced took a dot product a weight row (a load of x per row for every
vector of weights, a horizontal sum per output) and were load-bound above two rows; oneDNN's
packed GEMMs served steps above 8 rows. vdpbf16ps can do ~117 G multiply-adds/s here (a C loop of
24 independent accumulators: 3.65 G instructions/s on a Zen 4). The linear layers of a SmolLM2
decode step (30 layers and the LM head, cold weights) took 9.8 / 10.8 / 17.4 / 32 / 51 ms at
1 / 4 / 8 / 16 / 32 rows, against the GEMVs' 9.7 / 26.5 / 23.2 at 1 / 4 / 8; a later pair of runs
gave 16.3 / 46.9 ms at 8 / 32 rows against 24.4 / 57.8 for oneDNN's packed GEMMs of the same
shapes without their epilogues (ad-hoc timing). SwiGLU's silu is bf16_kernels' vectorised one under numpy's
error model: numba's zero-divisor check kept its loop scalar (gate and up for 32 rows, 30 layers: 34 ->
22 ms). Software prefetching 2-8 KB ahead made it slower, as did
blocks of 48 outputs with 8 rows a group at 32 rows (`make bench-engine` measures whole steps).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.attention_rows import AVAILABLE

PAIR_LANES = 32     # bf16 values one vdpbf16ps reads from each operand: 16 outputs x 2 inputs
BLOCK_OUTPUTS = 64  # outputs of one packed block: four vectors of accumulators a row
GROUP_ROWS = 6      # rows sharing a pass over a block: 24 accumulators of 32 vector registers


def can_run(width: int) -> bool:
    return AVAILABLE and width > 0 and width % PAIR_LANES == 0


def padded_outputs(outputs: int) -> int:
    """Outputs of a packed matrix: whole blocks of 64 (f32_dot's packing pads alike)."""
    return -(-outputs // BLOCK_OUTPUTS) * BLOCK_OUTPUTS


def pack(w: np.ndarray) -> np.ndarray:
    """[outputs, inputs] bf16 bits -> [blocks, inputs / 2, 64, 2] (zero outputs past the matrix's)."""
    outputs, inputs = w.shape
    padded = np.zeros((padded_outputs(outputs), inputs), np.uint16)
    padded[:outputs] = w
    return np.ascontiguousarray(padded.reshape(-1, BLOCK_OUTPUTS, inputs // 2, 2).transpose(0, 2, 1, 3))


if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from bus.numba_vectors import F32, I32, LANES, VF, VI32, at, call, dpbf16, item, splat
    from nodes.engines.bf16_kernels import (
        _bf16_bits,
        _inline,
        _njit,
        _njit_numpy_errors,
        _norm_rows_bits,
        _round,
        _silu_vectorised,
        _to_f32,
    )

    VECTORS = BLOCK_OUTPUTS // LANES   # accumulators a row

    def _group(num_rows: int):
        """An intrinsic `(xb, r, w, b, sums)`: sums[m, j] = xb[r + m] . (output 64b + j of w) for
        m < num_rows and j < 64, w packed. xb's rows are bf16 pairs (uint16 bits, w as `pack`
        makes it, vdpbf16ps) or float32 (w as f32_dot.pack makes it: [blocks, inputs, 64], FMAs);
        either way a step over the inputs reads 64 bytes of weights a vector of 16 outputs."""

        @intrinsic
        def group(typingctx, xb, r, w, b, sums):
            def codegen(context, builder, signature, args):
                xb_type, _, w_type, _, sums_type = signature.args
                f32 = xb_type.dtype == types.float32
                intp = context.get_value_type(types.intp)
                zero = ir.Constant(intp, 0)
                x_rows = [builder.bitcast(item(context, builder, xb_type, args[0],
                                               [builder.add(args[1], ir.Constant(intp, m)), zero]),
                                          ir.PointerType(F32 if f32 else I32)) for m in range(num_rows)]
                block = item(context, builder, w_type, args[2], [args[3]] + [zero] * (w_type.ndim - 1))
                accs = [[cgutils.alloca_once_value(builder, ir.Constant(VF, None)) for _ in range(VECTORS)]
                        for _ in range(num_rows)]
                steps = builder.extract_value(context.make_array(w_type)(context, builder, args[2]).shape, 1)
                per_vector = LANES if f32 else PAIR_LANES   # elements of w in 64 bytes
                with cgutils.for_range(builder, steps) as loop:
                    step = builder.mul(loop.index, ir.Constant(intp, VECTORS * per_vector))
                    weights = [builder.load(at(builder, block, builder.add(step, ir.Constant(intp, c * per_vector)),
                                               VF if f32 else VI32), align=4 if f32 else 2) for c in range(VECTORS)]
                    for m, x_row in enumerate(x_rows):
                        x_step = splat(builder, builder.load(builder.gep(x_row, [loop.index]), align=4 if f32 else 2))
                        for c, w_step in enumerate(weights):
                            acc = builder.load(accs[m][c])
                            if f32:
                                acc = call(builder, "llvm.fma.v16f32", VF, w_step, x_step, acc)
                            else:
                                acc = dpbf16(builder, acc, w_step, x_step)
                            builder.store(acc, accs[m][c])
                for m in range(num_rows):
                    row = item(context, builder, sums_type, args[4], [ir.Constant(intp, m), zero])
                    for c in range(VECTORS):
                        builder.store(builder.load(accs[m][c]), at(builder, row, c * LANES, VF), align=4)
                return context.get_dummy_value()
            return types.none(xb, r, w, b, sums), codegen
        return group

    _g1, _g2, _g3, _g4, _g5, _g6 = (_group(n) for n in range(1, GROUP_ROWS + 1))

    @_inline
    def _products(xb, r, n, w, b, sums):  # pragma: no cover - runs compiled
        """sums[:n] = rows r..r+n-1 of xb times block b of w (1 <= n <= GROUP_ROWS)."""
        if n == 6:
            _g6(xb, r, w, b, sums)
        elif n == 5:
            _g5(xb, r, w, b, sums)
        elif n == 4:
            _g4(xb, r, w, b, sums)
        elif n == 3:
            _g3(xb, r, w, b, sums)
        elif n == 2:
            _g2(xb, r, w, b, sums)
        else:
            _g1(xb, r, w, b, sums)

    @_inline
    def _block_sums(xb, w, b, sums):  # pragma: no cover - runs compiled
        """sums[m] = xb[m] times block b of w for every row, in groups as even as GROUP_ROWS allows."""
        rows = xb.shape[0]
        groups = (rows + GROUP_ROWS - 1) // GROUP_ROWS
        r = 0
        for g in range(groups):
            n = (rows - r) // (groups - g)
            _products(xb, r, n, w, b, sums[r:])
            r += n

    @_inline
    def _gemm(xb, w, residual, add, out):  # pragma: no cover - runs compiled
        """out = xb @ w.T (+ residual), block by block of 64 outputs."""
        sums = np.empty((xb.shape[0], BLOCK_OUTPUTS), np.float32)
        n = out.shape[1]
        for b in range(w.shape[0]):
            _block_sums(xb, w, b, sums)
            for m in range(out.shape[0]):
                for j in range(min(BLOCK_OUTPUTS, n - b * BLOCK_OUTPUTS)):
                    o = b * BLOCK_OUTPUTS + j
                    value = sums[m, j]
                    out[m, o] = _bf16_bits(value + _to_f32(residual[m, o]) if add else value)

    @_inline
    def _copy_rows(x, xb):  # pragma: no cover - runs compiled
        for m in range(x.shape[0]):
            for k in range(x.shape[1]):
                xb[m, k] = x[m, k]

    @_inline
    def _rows(x):  # pragma: no cover - runs compiled
        return np.empty((x.shape[0], x.shape[1]), np.uint16)

    @_njit
    def linear(x, w, out):  # pragma: no cover - runs compiled
        xb = _rows(x)
        _copy_rows(x, xb)
        _gemm(xb, w, out, False, out)

    @_njit
    def norm_linear(x, norm_w, eps, w, out):  # pragma: no cover - runs compiled
        xb = _rows(x)
        _norm_rows_bits(x, norm_w, eps, xb)
        _gemm(xb, w, out, False, out)

    @_njit
    def linear_add(x, w, residual, out):  # pragma: no cover - runs compiled
        xb = _rows(x)
        _copy_rows(x, xb)
        _gemm(xb, w, residual, True, out)

    @_njit_numpy_errors   # a division numba would check for zero kept silu's loop scalar
    def norm_swiglu(x, norm_w, eps, w_gate, w_up, out):  # pragma: no cover - runs compiled
        xb = _rows(x)
        _norm_rows_bits(x, norm_w, eps, xb)
        gate = np.empty((xb.shape[0], BLOCK_OUTPUTS), np.float32)
        up = np.empty((xb.shape[0], BLOCK_OUTPUTS), np.float32)
        n = out.shape[1]
        for b in range(w_gate.shape[0]):
            _block_sums(xb, w_gate, b, gate)
            _block_sums(xb, w_up, b, up)
            for m in range(out.shape[0]):
                for j in range(min(BLOCK_OUTPUTS, n - b * BLOCK_OUTPUTS)):
                    out[m, b * BLOCK_OUTPUTS + j] = _bf16_bits(up[m, j] * _round(_silu_vectorised(gate[m, j])))


def warmup() -> None:
    """Compile (or load from the disk cache) the kernels for the array types the runner passes."""
    if not AVAILABLE:
        raise RuntimeError("the CPU has no AVX512-BF16 (or numba is missing)")
    w = pack(np.zeros((4, PAIR_LANES), np.uint16))
    for rows in (1, 7):
        x = np.zeros((rows, PAIR_LANES), np.uint16)
        out = np.zeros((rows, 4), np.uint16)
        linear(x, w, out)
        norm_linear(x, x[0], 1e-5, w, out)
        linear_add(x, w, out, out)
        norm_swiglu(x, x[0], 1e-5, w, w, out)
