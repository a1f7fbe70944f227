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
at 576 inputs) comes from memory for the first group of rows and from cache for the others.
Above 6 rows the groups take turns over ranges of `CHUNK_STEPS` input steps (8 KB of a block), and
the first passes over a range share out the requests for the next range's lines into L2
(`_prefetch_mask`): before, memory sat idle while the later groups read the block from L2, since
the hardware prefetcher only runs a little ahead of the loads it sees, and the kernel read cold
weights at ~6 GB/s with 17 GB/s to be had. Each sum still runs over the inputs in order (a range's
partial sums go through `sums`), so no result changed. 30 layers of linear layers, cold weights,
in paired runs (ad-hoc timing, 2026-12-04, AMX Xeon): float32 at 8 / 16 / 32 rows 37.5 / 44.3 /
66.2 -> 29.8 / 33.1 / 49.8 ms; bf16 23.9 / 39.5 / 69.5 -> 17.1 / 32.3 / 62.6 ms (then only the
passes after the first made the requests; the first joining them gained 10-18 % more at 7-12
rows). Requesting the next block while the second pass ran, or spreading those requests over
every later pass without the ranges, gained about half as much. One group (2-6 rows, and a bf16
row alone) runs over a whole block in one pass and requests each step's lines a block ahead: the
hardware prefetcher alone kept the memory busy for one row of float32 (15.8 GB/s) but not for more
compute per line (6 rows: 10.3 GB/s, with the requests 14.1). 30 layers' linear layers at 1 / 2 /
4 / 6 rows: float32 unchanged / 27.5 / 34.9 / 39.3 -> 23.9 / 24.9 / 26.7 ms, bf16 14.1 / 17.9 /
20.5 / 24.7 -> 9.4 / 9.9 / 11.5 / 14.8 ms (ad-hoc, same machine).

Why: the GEMVs this replaced took a dot product a weight row (a load of x per row for every
vector of weights, a horizontal sum per output) and were load-bound above two rows; oneDNN's
packed GEMMs served steps above 8 rows. vdpbf16ps can do ~117 G multiply-adds/s here (a C loop of
24 independent accumulators: 3.65 G instructions/s on a Zen 4). The linear layers of a SmolLM2
decode step (30 layers and the LM head, cold weights) took 9.8 / 10.8 / 17.4 / 32 / 51 ms at
1 / 4 / 8 / 16 / 32 rows, against the GEMVs' 9.7 / 26.5 / 23.2 at 1 / 4 / 8; a later pair of runs
gave 16.3 / 46.9 ms at 8 / 32 rows against 24.4 / 57.8 for oneDNN's packed GEMMs of the same
shapes without their epilogues (ad-hoc timing). SwiGLU's silu is bf16_kernels' vectorised one under numpy's
error model: numba's zero-divisor check kept its loop scalar (gate and up for 32 rows, 30 layers: 34 ->
22 ms). Blocks of 48 outputs with 8 rows a group at 32 rows were slower (`make bench-engine`
measures whole steps).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.attention_rows import AVAILABLE

PAIR_LANES = 32     # bf16 values one vdpbf16ps reads from each operand: 16 outputs x 2 inputs
BLOCK_OUTPUTS = 64  # outputs of one packed block: four vectors of accumulators a row
GROUP_ROWS = 6      # rows sharing a pass over a block: 24 accumulators of 32 vector registers
CHUNK_STEPS = 32    # input steps (64 bytes of weights a vector) all of a block's passes run in turn


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

    def _group(num_rows: int, can_prefetch: bool):
        """An intrinsic `(xb, r, w, b, sums, k0, k1, ahead)`: sums[m, j] += xb[r + m, k0:k1] . (output
        64b + j of w)[k0:k1] for m < num_rows and j < 64, w packed, the sums starting from zero where
        k0 is 0. xb's rows are bf16 pairs (uint16 bits, w as `pack` makes it, vdpbf16ps; k counts
        pairs) or float32 (w as f32_dot.pack makes it: [blocks, inputs, 64], FMAs); either way a step
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
        ahead, and so does a single row where `lone_row_requests` (bf16: 30 layers' linear layers
        14.1 -> 9.9 ms; a float32 row streams at the memory's rate on the hardware prefetcher
        alone, and the requests cost it 6 %). Above one group the first min(groups, 4) passes
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
