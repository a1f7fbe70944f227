"""Bit casts between float32 and uint32 for numba kernels (numba has no scalar `view`).

Contract: where numba is importable (`AVAILABLE`), `f32_bits(x: float32) -> uint32` and
`bits_f32(b: uint32) -> float32` reinterpret a value's 32 bits, compiled to one LLVM bitcast (no
memory round trip). Only numba-compiled code may call them. Used by the KV int8 kernels
(bus.kv.int8_kernels) and the engine's bf16 kernels (nodes.engines.bf16_kernels).
"""

from __future__ import annotations

try:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # every caller has a path without numba
    intrinsic = None

AVAILABLE = intrinsic is not None

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
