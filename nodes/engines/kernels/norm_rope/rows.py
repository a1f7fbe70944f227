"""Hand-built LLVM vector code for the rows of a bf16 pass's RMSNorm and RoPE, with the roundings
of the scalar loops in norm_rope.bf16, which keep the rows these do not take.

Contract (only where `AVAILABLE`: llvm_rows.AVAILABLE, i.e. `kernels.cpu.probe().avx512bf16`;
called from numba-compiled code only; bf16 values are uint16 bit patterns; rows contiguous):
- `sum_of_squares(x, m)`: the float32 sum of x[m, k]**2 over row m (its width a multiple of 16).
- `normed_row(x, m, scale, norm_w, out)`: out[m, k] = bf16(bf16(x[m, k] * scale) * norm_w[k]) over
  row m, as bf16_scalar._normed rounds (the width a multiple of 16).
- `rope_token(qkv, t, cos, sin, pos, q_out, cache)`: token t of a span (qkv [rows, (heads +
  2 kv_heads) * head_dim]) at position pos: RoPE (rotate-half tables, its sign in sin) on its q
  heads into q_out[h, t] and its k heads into cache[0, g, pos], its v heads copied into
  cache[1, g, pos] (q_out [heads, rows, head_dim], cache [2, kv_heads, capacity, head_dim]). With
  a, b a head's two halves: bf16(bf16(a * cos) + b * sin) and bf16(bf16(b * cos') + a * sin'), as
  bf16_scalar._rope_pair and its caller round (head_dim // 2 a multiple of 16).
`can_take(width)` says whether a row (or a half head) of that width fits.

Why: LLVM vectorises the scalar loops at half the vector width, with its own rounding code (five
integer operations a value); here a rounding is one vcvtneps2bf16.
"""

from __future__ import annotations

from nodes.engines.kernels.llvm_rows import AVAILABLE

LANES = 16


def can_take(width: int) -> bool:
    return AVAILABLE and width > 0 and width % LANES == 0


if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_rows import to_bf16
    from nodes.engines.kernels.llvm_vectors import (
        F32,
        VF,
        VI16,
        at,
        call,
        index,
        item,
        load_bf16,
        splat,
        widen_bf16,
    )

    def _round(builder, value):
        """float32 -> the nearest bf16 value, as float32 (round to nearest even)."""
        return widen_bf16(builder, to_bf16(builder, value))

    def _row(context, builder, array_type, array, row):
        return item(context, builder, array_type, array, [row, index(context, 0)])

    def _vectors(builder, width):
        """Offsets 0, 16, .. of a row `width` wide (a run-time value)."""
        return cgutils.for_range_slice(builder, ir.Constant(width.type, 0), width, ir.Constant(width.type, LANES))

    def _shape(context, builder, array_type, array):
        return cgutils.unpack_tuple(builder, context.make_array(array_type)(context, builder, array).shape)

    def _width(context, builder, array_type, array):
        return _shape(context, builder, array_type, array)[1]

    @intrinsic
    def sum_of_squares(typingctx, x, m):
        def codegen(context, builder, signature, args):
            row = _row(context, builder, signature.args[0], args[0], args[1])
            width = _width(context, builder, signature.args[0], args[0])
            # Four chains of sums, so the FMAs do not wait on each other's latency.
            totals = [cgutils.alloca_once_value(builder, ir.Constant(VF, [0.0] * LANES)) for _ in range(4)]
            step = ir.Constant(width.type, 4 * LANES)
            whole = builder.mul(builder.udiv(width, step), step)

            def add_square(total, k):
                v = load_bf16(builder, row, k)
                builder.store(call(builder, "llvm.fma.v16f32", VF, v, v, builder.load(total)), total)

            with cgutils.for_range_slice(builder, ir.Constant(width.type, 0), whole, step) as (k, _):
                for c, total in enumerate(totals):
                    add_square(total, builder.add(k, ir.Constant(width.type, c * LANES)))
            with cgutils.for_range_slice(builder, whole, width, ir.Constant(width.type, LANES)) as (k, _):
                add_square(totals[0], k)
            vector = builder.fadd(builder.fadd(builder.load(totals[0]), builder.load(totals[1])),
                                  builder.fadd(builder.load(totals[2]), builder.load(totals[3])))
            return call(builder, "llvm.vector.reduce.fadd.v16f32", F32, ir.Constant(F32, 0.0), vector)
        return types.float32(x, m), codegen

    @intrinsic
    def normed_row(typingctx, x, m, scale, norm_w, out):
        def codegen(context, builder, signature, args):
            x_array, m_value, scale_value, w_array, out_array = args
            source = _row(context, builder, signature.args[0], x_array, m_value)
            target = _row(context, builder, signature.args[4], out_array, m_value)
            weight = item(context, builder, signature.args[3], w_array, [index(context, 0)])
            scales = splat(builder, scale_value)
            with _vectors(builder, _width(context, builder, signature.args[0], x_array)) as (k, _):
                scaled = _round(builder, builder.fmul(load_bf16(builder, source, k), scales))
                normed = builder.fmul(scaled, load_bf16(builder, weight, k))
                builder.store(to_bf16(builder, normed), at(builder, target, k, VI16), align=2)
            return context.get_dummy_value()
        return types.none(x, m, scale, norm_w, out), codegen

    @intrinsic
    def rope_token(typingctx, qkv, t, cos, sin, pos, q_out, cache):
        """RoPE on token t's q heads into q_out[h, t] and k heads into cache[0, g, pos], its v heads
        copied into cache[1, g, pos]: each cos and sin vector is loaded once for every head."""
        def codegen(context, builder, signature, args):
            qkv_array, t_value, cos_array, sin_array, pos_value, q_array, cache_array = args
            qkv_type, q_type, cache_type = signature.args[0], signature.args[5], signature.args[6]
            intp = t_value.type
            source = _row(context, builder, qkv_type, qkv_array, t_value)
            cos_row = _row(context, builder, signature.args[2], cos_array, pos_value)
            sin_row = _row(context, builder, signature.args[3], sin_array, pos_value)
            cache_shape = _shape(context, builder, cache_type, cache_array)
            num_heads = _shape(context, builder, q_type, q_array)[0]
            num_kv_heads, head_dim = cache_shape[1], cache_shape[3]
            half = builder.udiv(head_dim, ir.Constant(intp, 2))
            zero, one = ir.Constant(intp, 0), ir.Constant(intp, 1)

            def head(h):
                return builder.gep(source, [builder.mul(h, head_dim)])

            with _vectors(builder, half) as (d, _):
                d2 = builder.add(d, half)
                cos_low, cos_high = load_bf16(builder, cos_row, d), load_bf16(builder, cos_row, d2)
                sin_low, sin_high = load_bf16(builder, sin_row, d), load_bf16(builder, sin_row, d2)

                def rotate(src, target):
                    a, b = load_bf16(builder, src, d), load_bf16(builder, src, d2)
                    low = builder.fadd(_round(builder, builder.fmul(a, cos_low)), builder.fmul(b, sin_low))
                    high = builder.fadd(_round(builder, builder.fmul(b, cos_high)), builder.fmul(a, sin_high))
                    builder.store(to_bf16(builder, low), at(builder, target, d, VI16), align=2)
                    builder.store(to_bf16(builder, high), at(builder, target, d2, VI16), align=2)

                with cgutils.for_range_slice(builder, zero, num_heads, one) as (h, _):
                    rotate(head(h), item(context, builder, q_type, q_array, [h, t_value, zero]))
                with cgutils.for_range_slice(builder, zero, num_kv_heads, one) as (g, _):
                    rotate(head(builder.add(num_heads, g)), item(context, builder, cache_type, cache_array,
                                                                 [zero, g, pos_value, zero]))
            v_heads = builder.add(num_heads, num_kv_heads)
            with cgutils.for_range_slice(builder, zero, num_kv_heads, one) as (g, _):
                src = head(builder.add(v_heads, g))
                target = item(context, builder, cache_type, cache_array, [one, g, pos_value, zero])
                with _vectors(builder, head_dim) as (d, _):
                    builder.store(builder.load(at(builder, src, d, VI16), align=2), at(builder, target, d, VI16), align=2)
            return context.get_dummy_value()
        return types.none(qkv, t, cos, sin, pos, q_out, cache), codegen
