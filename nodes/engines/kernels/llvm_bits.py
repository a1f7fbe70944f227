"""Bit casts between float32 and uint32 for numba kernels (numba has no scalar `view`).

Contract: where `AVAILABLE` (numba and llvmlite import, and `kernels.cpu.probe().numba`),
`f32_bits(x: float32) -> uint32` and `bits_f32(b: uint32) -> float32` reinterpret a value's 32 bits,
compiled to one LLVM bitcast (no memory round trip); `bf16_round(x) -> float32` and
`bf16_bits(x) -> uint16` round a float32 to the nearest bf16 (ties to even, as torch converts finite
values) in 32-bit integer lanes. Only numba-compiled code may call them. Used by the KV int8 kernels
(kernels.kv_int8) and the bf16 kernels (kernels.bf16_scalar).
"""

from __future__ import annotations

try:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # every caller has a path without numba
    intrinsic = None

from nodes.engines.kernels.cpu import probe

AVAILABLE = intrinsic is not None and probe().numba

if AVAILABLE:
    @intrinsic
    def f32_bits(typingctx, value):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(types.float32), codegen

    @intrinsic
    def bits_f32(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())
        return types.float32(types.uint32), codegen

    @intrinsic
    def bf16_round(typingctx, value):
        """float32 -> the nearest bf16 value (ties to even), as float32: one add and mask on the bits,
        in 32-bit integers (numba's own integer arithmetic widens to 64 bits, which would halve the
        lanes of every loop that rounds and keep some loops scalar)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(_rounded_bits(builder, args[0]), ir.FloatType())
        return types.float32(types.float32), codegen

    @intrinsic
    def bf16_bits(typingctx, value):
        """float32 -> the bit pattern (uint16) of the nearest bf16 (ties to even; finite values)."""
        def codegen(context, builder, signature, args):
            top = builder.lshr(_rounded_bits(builder, args[0]), ir.Constant(ir.IntType(32), 16))
            return builder.trunc(top, ir.IntType(16))
        return types.uint16(types.float32), codegen

    def _rounded_bits(builder, value):
        i32 = ir.IntType(32)
        bits = builder.bitcast(value, i32)
        odd = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)), odd)
        return builder.and_(rounded, ir.Constant(i32, 0xFFFF0000))
