"""LLVM vector building blocks for numba intrinsics: pointers into arrays, vector loads and stores,
bf16 widening, splats, intrinsic calls and the bf16 pair dot product, shared by the hand-vectorised
kernels of this package.

Contract: where `AVAILABLE` (numba and llvmlite import, and `kernels.cpu.probe().numba`), these
functions emit IR inside an intrinsic's codegen: `item(context, builder, array_type, array, indices)`
is a pointer to one element, `at(builder, pointer, offset, vector_type)` a pointer `offset` elements
further cast to a vector pointer (loads and stores through it are unaligned),
`load_bf16(builder, pointer, offset)` 16 bf16 values (uint16 bits) widened to float32
(`widen_bf16(builder, bits)` widens 16 already loaded), `splat(builder, scalar)` a scalar in all 16
lanes, `call(builder, name, return_type, *args)` a call of an LLVM intrinsic by name,
`dpbf16(builder, sums, a, b)` vdpbf16ps: 16 float32 `sums` plus the products of the bf16 pairs of
`a` and `b` (VI32 vectors of pairs), summed pair by pair (inline asm: llvmlite has no bfloat vector
type; only for CPUs with AVX512-BF16). Only numba-compiled code runs what they emit.
"""

from __future__ import annotations

try:
    from llvmlite import binding, ir
    from numba import types
    from numba.core import cgutils
except ImportError:  # every caller has a path without numba
    ir = None

from nodes.engines.kernels.cpu import probe

AVAILABLE = ir is not None and probe().numba
LANES = 16   # float32 lanes of one AVX-512 vector

if AVAILABLE:
    F32 = ir.FloatType()
    I32 = ir.IntType(32)
    I64 = ir.IntType(64)
    VF = ir.VectorType(F32, LANES)
    VI16 = ir.VectorType(ir.IntType(16), LANES)
    VI32 = ir.VectorType(I32, LANES)

    def item(context, builder, array_type, array, indices):
        """Pointer to array[indices] (numba array value, intp index values; no bounds check)."""
        data = context.make_array(array_type)(context, builder, array)
        return cgutils.get_item_pointer(context, builder, array_type, data, indices,
                                        wraparound=False, boundscheck=False)

    def index(context, value: int):
        return context.get_constant(types.intp, value)

    def at(builder, pointer, offset, vector_type):
        """`pointer + offset` elements (a Python int, or an integer IR value), as a pointer to a vector."""
        index = offset if isinstance(offset, ir.Value) else ir.Constant(I64, offset)
        element = builder.gep(pointer, [index], inbounds=True)
        return builder.bitcast(element, ir.PointerType(vector_type))

    def widen_bf16(builder, bits):
        """16 bf16 values (uint16 bits) as float32: their bits are its upper half."""
        return builder.bitcast(builder.shl(builder.zext(bits, VI32), ir.Constant(VI32, [16] * LANES)), VF)

    def load_bf16(builder, pointer, offset):
        """16 bf16 values from pointer + offset, widened to float32."""
        return widen_bf16(builder, builder.load(at(builder, pointer, offset, VI16), align=2))

    def splat(builder, scalar):
        vector = builder.insert_element(ir.Constant(ir.VectorType(scalar.type, LANES), ir.Undefined), scalar,
                                        ir.Constant(I32, 0))
        return builder.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined), ir.Constant(VI32, [0] * LANES))

    def call(builder, name, return_type, *args):
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(return_type, [arg.type for arg in args]), name)
        return builder.call(function, list(args))

    _DPBF16 = ir.FunctionType(VF, [VI32, VI32, VF])
    binding.initialize_native_asmparser()   # LLVM assembles inline asm (dpbf16) only with it

    def dpbf16(builder, sums, a, b):
        return builder.asm(_DPBF16, "vdpbf16ps $2, $1, $0", "=v,v,v,0", [a, b, sums], False)
