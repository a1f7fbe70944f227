"""bf16 linear layers for 1-32 rows on AVX512-BF16's pair dot product (vdpbf16ps), as outer
products over weights packed in pairs (kernels.dispatch's choice where the CPU has no AMX).

Contract: `AVAILABLE` is llvm_rows.AVAILABLE (`kernels.cpu.probe().avx512bf16`); `can_run(width)`
where a matrix's input width is a multiple of 32. `pack(w)` turns a bf16 matrix [outputs, inputs]
(uint16 bits) into [ceil(outputs / 64), inputs / 2, 64, 2]: per block of 64 outputs and pair of
inputs (2k, 2k + 1), the 64 outputs' two weights side by side (outputs past the matrix's are zero;
`padded_outputs` counts them). For x [rows, inputs] and packed matrices, any number of rows (`out`'s
width is the true output count): `linear(x, w, out)` = x @ w.T; `norm_linear(x, norm_w, eps, w, out)`
= RMSNorm(x) @ w.T; `linear_add(x, w, residual, out)` = residual + x @ w.T (out may be residual);
`norm_swiglu(x, norm_w, eps, w_gate, w_up, out)` = silu(h @ w_gate.T) * (h @ w_up.T), h = RMSNorm(x).
They round where torch's bf16 path rounds (kernels.bf16_scalar; the contract in float64:
tests/nodes/engines/kernels/linear/bf16_reference.py); results differ only by float32 summation
order (and vdpbf16ps treats float32 denormals as zero, far below any model's values).
Every output's sum runs over the input pairs in order whatever the number of rows, so a row's
result does not depend on the rows beside it. `warmup()` compiles them (seconds on first use;
cached on disk after) and raises where they cannot be built.

How: per block of 64 outputs and up to `GROUP_ROWS` rows, each input pair loads the block's four
vectors of 16 outputs x 2 weights, broadcasts each row's two inputs, and vdpbf16ps adds into
4 x rows float32 accumulators held in registers (each lane one output: no horizontal sums). Above
one group the groups take turns over ranges of `CHUNK_STEPS` inputs (the block from memory for the
first, from cache for the rest), and the first passes over a range request the next range's lines
into L2 (`_prefetch_mask`), so memory does not sit idle while later groups read L2; one group runs a
whole block in one pass, requesting each step's lines a block ahead.

Why: a GEMV loads x once per weight vector and row and sums each output horizontally, so it is
load-bound above two rows; outer products reuse each weight load for every row (the widening GEMVs
this replaced lost to compiled torch: docs/KERNELS.md). linear.dot_f32 runs
the same loops in float32. docs/KERNELS.md has the measured gain over compiled torch
(`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.llvm_rows import AVAILABLE

PAIR_LANES = 32     # bf16 values one vdpbf16ps reads from each operand: 16 outputs x 2 inputs
BLOCK_OUTPUTS = 64  # outputs of one packed block: four vectors of accumulators a row
GROUP_ROWS = 6      # rows sharing a pass over a block: 24 accumulators of 32 vector registers
CHUNK_STEPS = 32    # input steps (64 bytes of weights a vector) all of a block's passes run in turn


def can_run(width: int) -> bool:
    return AVAILABLE and width > 0 and width % PAIR_LANES == 0


def padded_outputs(outputs: int) -> int:
    """Outputs of a packed matrix: whole blocks of 64 (linear.dot_f32's packing pads alike)."""
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

    from nodes.engines.kernels.bf16_scalar import (
        _bf16_bits,
        _norm_rows_bits,
        _round,
        _silu_vectorised,
        _to_f32,
    )
    from nodes.engines.kernels.jit import inline as _inline
    from nodes.engines.kernels.jit import njit as _njit
    from nodes.engines.kernels.jit import njit_numpy_errors as _njit_numpy_errors
    from nodes.engines.kernels.llvm_vectors import F32, I32, LANES, VF, VI32, at, call, dpbf16, item, splat

    VECTORS = BLOCK_OUTPUTS // LANES   # accumulators a row

    def _group(num_rows: int, can_prefetch: bool):
        """An intrinsic `(xb, r, w, b, sums, k0, k1, ahead)`: sums[m, j] += xb[r + m, k0:k1] . (output
        64b + j of w)[k0:k1] for m < num_rows and j < 64, w packed, the sums starting from zero where
        k0 is 0. xb's rows are bf16 pairs (uint16 bits, w as `pack` makes it, vdpbf16ps; k counts
        pairs) or float32 (w as dot_f32.pack makes it: [blocks, inputs, 64], FMAs); either way a step
        over the inputs reads 64 bytes of weights a vector of 16 outputs. Each output's products are
        added in input order, so running the inputs in consecutive ranges gives the same sums.
        With `can_prefetch`, each step also requests, for each bit c set in `ahead`, the line of
        vector c one range further on (k1 - k0 steps ahead; past a block's end that is the next
        block's start, and past the matrix's end a request that loads nothing) into L2."""

        @intrinsic
        def group(typingctx, xb, r, w, b, sums, k0, k1, ahead):
            def codegen(context, builder, signature, args):
                xb_type, _, w_type, _, sums_type, _, _, _ = signature.args
                f32 = xb_type.dtype == types.float32
                intp = context.get_value_type(types.intp)
                zero = ir.Constant(intp, 0)
                k0, k1 = args[5], args[6]
                x_rows = [builder.bitcast(item(context, builder, xb_type, args[0],
                                               [builder.add(args[1], ir.Constant(intp, m)), zero]),
                                          ir.PointerType(F32 if f32 else I32)) for m in range(num_rows)]
                block = item(context, builder, w_type, args[2], [args[3]] + [zero] * (w_type.ndim - 1))
                sum_rows = [item(context, builder, sums_type, args[4], [ir.Constant(intp, m), zero])
                            for m in range(num_rows)]
                first = builder.icmp_signed("==", k0, zero)
                accs = [[cgutils.alloca_once_value(builder, builder.select(
                    first, ir.Constant(VF, None), builder.load(at(builder, sum_rows[m], c * LANES, VF), align=4)))
                    for c in range(VECTORS)] for m in range(num_rows)]
                per_vector = LANES if f32 else PAIR_LANES   # elements of w in 64 bytes
                prefetch = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [ir.PointerType(ir.IntType(8))] + [I32] * 3), "llvm.prefetch.p0")
                flags = [ir.Constant(I32, v) for v in (0, 2, 1)]   # read, into L2 (and beyond), data
                num_steps = builder.sub(k1, k0)   # also how far ahead the next range's lines lie
                with cgutils.for_range(builder, num_steps) as loop:
                    k = builder.add(k0, loop.index)
                    step = builder.mul(k, ir.Constant(intp, VECTORS * per_vector))
                    weights = [builder.load(at(builder, block, builder.add(step, ir.Constant(intp, c * per_vector)),
                                               VF if f32 else VI32), align=4 if f32 else 2) for c in range(VECTORS)]
                    if can_prefetch:
                        next_step = builder.mul(builder.add(k, num_steps), ir.Constant(intp, VECTORS * per_vector))
                    for c in range(VECTORS if can_prefetch else 0):
                        wanted = builder.icmp_unsigned("!=", builder.and_(args[7], ir.Constant(args[7].type, 1 << c)),
                                                       ir.Constant(args[7].type, 0))
                        with builder.if_then(wanted):
                            # Not `inbounds`: past the matrix's end the address is only a hint.
                            line = builder.gep(block, [builder.add(next_step, ir.Constant(intp, c * per_vector))])
                            builder.call(prefetch, [builder.bitcast(line, ir.PointerType(ir.IntType(8))), *flags])
                    for m, x_row in enumerate(x_rows):
                        x_step = splat(builder, builder.load(builder.gep(x_row, [k]), align=4 if f32 else 2))
                        for c, w_step in enumerate(weights):
                            acc = builder.load(accs[m][c])
                            if f32:
                                acc = call(builder, "llvm.fma.v16f32", VF, w_step, x_step, acc)
                            else:
                                acc = dpbf16(builder, acc, w_step, x_step)
                            builder.store(acc, accs[m][c])
                for m in range(num_rows):
                    for c in range(VECTORS):
                        builder.store(builder.load(accs[m][c]), at(builder, sum_rows[m], c * LANES, VF), align=4)
                return context.get_dummy_value()
            return types.none(xb, r, w, b, sums, k0, k1, ahead), codegen
        return group

    _g1, _g2, _g3, _g4, _g5, _g6 = (_group(n, False) for n in range(1, GROUP_ROWS + 1))
    _p1, _p2, _p3, _p4, _p5, _p6 = (_group(n, True) for n in range(1, GROUP_ROWS + 1))

    @_inline
    def _products(xb, r, n, w, b, sums, k0, k1, ahead):  # pragma: no cover - runs compiled
        """sums[:n] (+)= rows r..r+n-1 of xb times block b of w over inputs k0..k1-1 (1 <= n <=
        GROUP_ROWS), requesting the lines `ahead` picks of the next range (none where it is 0)."""
        if ahead:
            if n == 6:
                _p6(xb, r, w, b, sums, k0, k1, ahead)
            elif n == 5:
                _p5(xb, r, w, b, sums, k0, k1, ahead)
            elif n == 4:
                _p4(xb, r, w, b, sums, k0, k1, ahead)
            elif n == 3:
                _p3(xb, r, w, b, sums, k0, k1, ahead)
            elif n == 2:
                _p2(xb, r, w, b, sums, k0, k1, ahead)
            else:
                _p1(xb, r, w, b, sums, k0, k1, ahead)
        elif n == 6:
            _g6(xb, r, w, b, sums, k0, k1, 0)
        elif n == 5:
            _g5(xb, r, w, b, sums, k0, k1, 0)
        elif n == 4:
            _g4(xb, r, w, b, sums, k0, k1, 0)
        elif n == 3:
            _g3(xb, r, w, b, sums, k0, k1, 0)
        elif n == 2:
            _g2(xb, r, w, b, sums, k0, k1, 0)
        else:
            _g1(xb, r, w, b, sums, k0, k1, 0)

    @_inline
    def _prefetch_mask(g, groups, rows, lone_row_requests):  # pragma: no cover - runs compiled
        """The vectors of the next range pass g requests (bit c: vector c). One group's range is
        the whole block, so a group of 2-6 rows requests all four lines of each step a block
        ahead, and so does a single row where `lone_row_requests` (bf16; a float32 row streams at
        the memory's rate on the hardware prefetcher alone, and the requests only cost it time).
        Above one group the first min(groups, 4) passes
        over a range, the first one included, share the four lines of the next range."""
        if groups == 1:
            return (1 << VECTORS) - 1 if rows > 1 or lone_row_requests else 0
        helpers = min(groups, VECTORS)
        if g >= helpers:
            return 0
        first, end = g * VECTORS // helpers, (g + 1) * VECTORS // helpers
        return ((1 << end) - 1) ^ ((1 << first) - 1)

    @_inline
    def _block_sums(xb, w, b, sums, lone_row_requests=True):  # pragma: no cover - runs compiled
        """sums[m] = xb[m] times block b of w for every row, in groups as even as GROUP_ROWS allows.
        Above one group the groups take turns over `CHUNK_STEPS` inputs at a time, and the first
        passes over a range request the next one: memory is otherwise idle while they read L2.
        `lone_row_requests`: a single row requests its lines ahead too (`_prefetch_mask`)."""
        rows, steps = xb.shape[0], w.shape[1]
        groups = (rows + GROUP_ROWS - 1) // GROUP_ROWS
        chunk = steps if groups == 1 else CHUNK_STEPS
        for k0 in range(0, steps, chunk):
            k1 = min(k0 + chunk, steps)
            r = 0
            for g in range(groups):
                n = (rows - r) // (groups - g)
                _products(xb, r, n, w, b, sums[r:], k0, k1, _prefetch_mask(g, groups, rows, lone_row_requests))
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
