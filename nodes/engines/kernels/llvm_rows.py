"""Hand-built LLVM vector code for the rows of prefill attention: the softmax of a row of scores,
and the scaling of an output row into bf16.

Contract (only where `AVAILABLE`: `kernels.cpu.probe().avx512bf16`, i.e. numba and a CPU with
AVX512-BF16; called from numba-compiled code only; bf16 values are uint16 bit patterns; rows contiguous):
- `softmax_row(scores, weights, i, num_visible, width, scale)`: with m the maximum of
  scores[i, :num_visible], writes weights[i, j] = bf16(exp(scale * (scores[i, j] - m))) for
  j < num_visible and 0 for num_visible <= j < width, and returns the float32 sum of the unrounded
  exps. `width` is a multiple of 32 and scores[i] has at least `width` readable floats; lanes at
  or past num_visible are never computed on (they may hold anything: NaN, denormals, garbage).
  `weights` may alias `scores` row for row (weights[i] the first half of scores[i]'s bytes): each
  block's scores are read before its weights are written, and weights run behind.
- `causal_softmax_rows(scores, weights, i0, first_visible, last_visible, width, scale, totals)`:
  softmax_row for the CAUSAL_ROWS rows i = i0, i0 + 1, ... of a causal block at once, row i seeing
  min(first_visible + i, last_visible) keys, each row's sum stored in totals[i].
- `scaled_row(acc, i, factor, out, row, column)`: out[row, column:column + 64] =
  bf16(acc[i, :64] * factor).
exp is 2**t on t = log2(e) * scale * (s - m) <= 0: 2**floor(t) by vscalefps times a degree-4
polynomial for the fraction (relative error ~4e-6, against bf16's 4e-3 step), t clamped at -126
(weights below 1e-38 become 1e-38 instead of less; no denormals, which cost a microcode assist).
bf16 by vcvtneps2bf16 (round to nearest even, as `llvm_bits.bf16_bits` does for finite values).

Why by hand: the softmax is the largest cost of attention in a long bf16 prefill, and numba's loops
keep the running maximum and sum in memory; here they stay in registers, two 16-key blocks an
iteration. A row alone also pays fixed costs (loop exits that mispredict as each row's length
changes, two dependent horizontal reductions); CAUSAL_ROWS rows in one loop share the exits and
overlap the reductions.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.cpu import probe

LANES = 16
CAUSAL_ROWS = 4   # rows causal_softmax_rows takes at once
LOG2E = 1.4426950408889634


AVAILABLE = probe().avx512bf16   # numba, and the CPU converts to bf16 in vectors


def exp2_coefficients(degree: int = 4) -> list[float]:
    """p(f) ~ 2**f on [0, 1) with p(0) = 1 exactly (a row's maximum gets weight 1): least squares in
    relative error at Chebyshev nodes."""
    f = np.cos(np.pi * (np.arange(256) + 0.5) / 256) * 0.5 + 0.5
    weight = 2.0 ** -f
    # p(f) = 1 + f * (c1 + c2 f + ...): fit c1.. so that p(f) * 2**-f ~ 1.
    basis = np.vander(f, degree, increasing=True) * (f * weight)[:, None]
    rest, *_ = np.linalg.lstsq(basis, 1.0 - weight, rcond=None)
    return [1.0] + [float(c) for c in rest]


if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_vectors import F32, I32, VF, VI16, VI32, at, call, index, item, splat

    _COEFFICIENTS = exp2_coefficients()
    _IOTA = ir.Constant(VI32, list(range(LANES)))
    _LOWEST = -3.0e38

    class _BFloat(ir.Type):
        """LLVM's bfloat, which llvmlite has no class for: the element type vcvtneps2bf16 returns."""

        def _to_string(self) -> str:
            return "bfloat"

        def __eq__(self, other) -> bool:
            return isinstance(other, _BFloat)

        def __hash__(self) -> int:
            return hash("bfloat")

    _VBF = ir.VectorType(_BFloat(), LANES)

    def _vf(builder, name, *args):
        return call(builder, name, VF, *args)

    def _constant(value: float):
        return ir.Constant(VF, [value] * LANES)

    def to_bf16(builder, value):
        return builder.bitcast(call(builder, "llvm.x86.avx512bf16.cvtneps2bf16.512", _VBF, value), VI16)

    def exp2(builder, t):
        t = _vf(builder, "llvm.maxnum.v16f32", t, _constant(-126.0))
        whole = _vf(builder, "llvm.floor.v16f32", t)
        fraction = builder.fsub(t, whole)
        p = _constant(_COEFFICIENTS[-1])
        for c in reversed(_COEFFICIENTS[:-1]):
            p = _vf(builder, "llvm.fma.v16f32", p, fraction, _constant(c))
        return _vf(builder, "llvm.x86.avx512.mask.scalef.ps.512", p, whole, _constant(0.0),
                   ir.Constant(ir.IntType(16), 0xFFFF), ir.Constant(I32, 4))

    def _visible(builder, j0, limit):
        first = splat(builder, builder.trunc(j0, I32))
        return builder.icmp_signed("<", builder.add(_IOTA, first), splat(builder, builder.trunc(limit, I32)))

    def _pairs_of_blocks(builder, first, last, step, body):
        """body(u, j0) for both 16-key blocks u of the 32-key pairs first..last-1 (two chains of
        running values, so neither waits on the other's latency)."""
        one = ir.Constant(first.type, 1)
        with cgutils.for_range_slice(builder, first, last, one, inc=True) as (pair, _):
            for u in range(2):
                body(u, builder.add(builder.mul(pair, step), ir.Constant(first.type, u * LANES)))

    def _softmax(builder, rows, width_value, scale_value):
        """The softmax of several rows at once: `rows` is [(score pointer, weight pointer, visible)].
        Their loops run together (one loop exit for all of them, and independent chains that fill
        the vector ports) over the pairs of 16-key blocks every row sees whole, then over the rest
        up to `width` with each row's own mask. Returns each row's float32 sum."""
        fewest = rows[0][2]
        for _, _, visible in rows[1:]:   # every row's masked tail starts where the shortest row's does
            fewest = builder.select(builder.icmp_signed("<", visible, fewest), visible, fewest)
        step = ir.Constant(fewest.type, 2 * LANES)
        whole_pairs, pairs = builder.udiv(fewest, step), builder.udiv(width_value, step)
        spans = ((ir.Constant(fewest.type, 0), whole_pairs, False), (whole_pairs, pairs, True))

        def load(row, j0, masked):
            values = builder.load(at(builder, row[0], j0, VF), align=4)
            return builder.select(_visible(builder, j0, row[2]), values, _constant(_LOWEST)) if masked else values

        tops = [[cgutils.alloca_once_value(builder, _constant(_LOWEST)) for _ in range(2)] for _ in rows]
        for first, last, masked in spans:
            def take_max(u, j0, masked=masked):
                for row, top in zip(rows, tops, strict=True):
                    builder.store(_vf(builder, "llvm.maxnum.v16f32", builder.load(top[u]), load(row, j0, masked)), top[u])
            _pairs_of_blocks(builder, first, last, step, take_max)
        factor = builder.fmul(scale_value, ir.Constant(F32, LOG2E))
        factors = splat(builder, factor)
        shifts = []
        for top in tops:
            peak = call(builder, "llvm.vector.reduce.fmax.v16f32", F32,
                        _vf(builder, "llvm.maxnum.v16f32", builder.load(top[0]), builder.load(top[1])))
            shifts.append(splat(builder, builder.fsub(ir.Constant(F32, 0.0), builder.fmul(peak, factor))))
        # One chain of sums a row when several rows interleave; two for a row alone.
        sums = [[cgutils.alloca_once_value(builder, _constant(0.0)) for _ in range(1 if len(rows) > 1 else 2)]
                for _ in rows]
        for first, last, masked in spans:
            def take_exp(u, j0, masked=masked):
                for row, shift, total in zip(rows, shifts, sums, strict=True):
                    e = exp2(builder, _vf(builder, "llvm.fma.v16f32", load(row, j0, masked), factors, shift))
                    if masked:
                        e = builder.select(_visible(builder, j0, row[2]), e, _constant(0.0))
                    builder.store(to_bf16(builder, e), at(builder, row[1], j0, VI16), align=2)
                    chain = total[u % len(total)]
                    builder.store(builder.fadd(builder.load(chain), e), chain)
            _pairs_of_blocks(builder, first, last, step, take_exp)
        totals = []
        for total in sums:
            vector = builder.load(total[0]) if len(total) == 1 else builder.fadd(builder.load(total[0]), builder.load(total[1]))
            totals.append(call(builder, "llvm.vector.reduce.fadd.v16f32", F32, ir.Constant(F32, 0.0), vector))
        return totals

    def _row_pointers(context, builder, signature, scores_array, weights_array, row):
        zero = index(context, 0)
        return (item(context, builder, signature.args[0], scores_array, [row, zero]),
                item(context, builder, signature.args[1], weights_array, [row, zero]))

    @intrinsic
    def softmax_row(typingctx, scores, weights, i, num_visible, width, scale):
        def codegen(context, builder, signature, args):
            scores_array, weights_array, row, visible, width_value, scale_value = args
            score_row, weight_row = _row_pointers(context, builder, signature, scores_array, weights_array, row)
            return _softmax(builder, [(score_row, weight_row, visible)], width_value, scale_value)[0]
        return types.float32(scores, weights, i, num_visible, width, scale), codegen

    @intrinsic
    def causal_softmax_rows(typingctx, scores, weights, i0, first_visible, last_visible, width, scale, totals):
        def codegen(context, builder, signature, args):
            scores_array, weights_array, row0, first, last, width_value, scale_value, totals_array = args
            indices = [builder.add(row0, ir.Constant(row0.type, r)) for r in range(CAUSAL_ROWS)]
            rows = []
            for row in indices:
                wanted = builder.add(first, row)
                visible = builder.select(builder.icmp_signed("<", wanted, last), wanted, last)
                rows.append((*_row_pointers(context, builder, signature, scores_array, weights_array, row), visible))
            for row, total in zip(indices, _softmax(builder, rows, width_value, scale_value), strict=True):
                builder.store(total, item(context, builder, signature.args[7], totals_array, [row]))
            return context.get_dummy_value()
        return types.none(scores, weights, i0, first_visible, last_visible, width, scale, totals), codegen

    @intrinsic
    def scaled_row(typingctx, acc, i, factor, out, row, column):
        def codegen(context, builder, signature, args):
            acc_type, out_type = signature.args[0], signature.args[3]
            acc_array, acc_row, factor_value, out_array, out_row, out_column = args
            source = item(context, builder, acc_type, acc_array, [acc_row, index(context, 0)])
            target = item(context, builder, out_type, out_array, [out_row, out_column])
            factors = splat(builder, factor_value)
            for c in range(4):
                offset = ir.Constant(out_column.type, c * LANES)
                values = builder.fmul(builder.load(at(builder, source, offset, VF), align=4), factors)
                builder.store(to_bf16(builder, values), at(builder, target, offset, VI16), align=2)
            return context.get_dummy_value()
        return types.none(acc, i, factor, out, row, column), codegen
