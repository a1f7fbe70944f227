"""Scalar bf16 arithmetic for numba kernels, rounded where torch's bf16 path rounds.

Contract (only where `kernels.cpu.probe().numba`; called from numba-compiled code only; bf16 values
travel as uint16 bit patterns): `_to_f32(bits)` widens bf16 bits to float32; `_round(v)` rounds a
float32 to the nearest bf16 value; `_bf16_bits(v)` gives its bits; `_prefetch(a, i, j)` asks for
the cache line of a 2-D array's element; `_prefetch_ahead(rows, j, ahead)` requests a row ahead;
`_norm_scale`, `_normed`, `_norm_rows`, `_norm_rows_bits` are llama_ops.rms_norm's bf16 branch (float32
statistics, the scale and the product rounded to bf16 as torch rounds them); `_rope_pair` is
llama_ops.apply_rope for one pair of values; `_silu` and `_silu_vectorised` (a branch-free exp for
loops LLVM vectorises) are torch's silu in float32. The linear, attention and norm kernels all
build on these, so every path rounds alike and the paths differ only by float32 summation order.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.cpu import probe
from nodes.engines.kernels.jit import inline as _inline

if probe().numba:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_bits import bf16_bits as _bf16_bits  # float32 -> bf16 bits, nearest even
    from nodes.engines.kernels.llvm_bits import bf16_round as _round  # float32 -> nearest bf16 value
    from nodes.engines.kernels.llvm_bits import bits_f32 as _bits_f32
    @intrinsic
    def _to_f32(typingctx, bits):
        """bf16 bits (uint16) -> float32: the bits are float32's upper half."""
        def codegen(context, builder, signature, args):
            wide = builder.zext(args[0], ir.IntType(32))
            return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())
        return types.float32(types.uint16), codegen


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


    @_inline
    def _load_rows(x, xf):  # pragma: no cover - runs compiled
        for m in range(x.shape[0]):
            for k in range(x.shape[1]):
                xf[m, k] = _to_f32(x[m, k])

    @_inline
    def _norm_scale(x, m, eps):  # pragma: no cover - runs compiled
        """llama_ops.rms_norm's bf16 branch for row m: float32 statistics, the scale rounded to bf16."""
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
        """x[m, k] after RMSNorm (scale from _norm_scale), rounded twice as llama_ops.rms_norm's bf16
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
        """RMSNorm of x's rows into bf16 bits (llama_ops.rms_norm's bf16 output, bit for bit)."""
        for m in range(x.shape[0]):
            scale = _norm_scale(x, m, eps)
            for k in range(x.shape[1]):
                out[m, k] = _bf16_bits(_normed(x, m, k, norm_w, scale))

    @_inline
    def _rope_pair(qkv, m, base, d, half, cos, sin, pos):  # pragma: no cover - runs compiled
        """Values d and d + half of the head at qkv[m, base:] after RoPE, with x * cos rounded as
        llama_ops.apply_rope rounds it (rotate-half tables, its sign in sin); the caller rounds the sums."""
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
