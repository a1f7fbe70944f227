"""Hand-built vector code for one row of the `int8` codec: its range, its codes, its decode.

Contract (only where `llvm_vectors.AVAILABLE`, i.e. `kernels.cpu.probe().numba`; called from
numba-compiled code only; rows of `width` values, a multiple of 16, float32 or bf16 bits (uint16),
last dimension contiguous):
- `make_row_range(width)` returns an intrinsic `row_range(src, r, check) -> (min, max)` of row r;
  it adds each value's (x - x) into the 16 float32 lanes of `check`, which stay 0 unless a value
  is NaN or infinite (the caller tests them once per call).
- `make_row_codes(width)` returns `row_codes(src, r, low, inverse, codes, out_row)`:
  codes[out_row, j] = uint8(int32(min(max((x - low) * inverse + 0.5, 0), 255.5))), in that order
  of float32 operations without FMA contraction, so the codes are bit-identical to
  bus.kv.quant's reference (round half up by truncation).
- `make_row_decode_bf16(width)` / `make_row_decode_f32(width)` return
  `row_decode(codes, p, t, low, step, out)`: out[p, t, :] = code * step + low (product, then sum,
  as the reference), into bf16 (nearest even) or float32; the float32 one with streaming stores
  (64-byte-aligned rows; `store_fence()` after the last).
- `make_prefetch_row(width)` returns `prefetch_row(src, r)`: a prefetch of each line of row r.
bf16 rows are widened exactly (their bits are float32's upper half).

Why: in numba's loops the lane arrays of the min/max live in memory, and may alias the source as
far as LLVM knows. Here a row is a few vector registers: min/max and the check are lane-wise,
reduced once by shuffles, and the codes are one vector expression per 16 values.
"""

from __future__ import annotations

from nodes.engines.kernels import llvm_vectors

if llvm_vectors.AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_vectors import F32, LANES, VF, VI32, at, item, load_bf16, splat

    def _row(context, builder, src_type, src, r, width):
        """Row r of src as float32 vectors."""
        start = item(context, builder, src_type, src, [r, context.get_constant(types.intp, 0)])
        if src_type.dtype == types.float32:
            return [builder.load(at(builder, start, c, VF), align=4) for c in range(0, width, LANES)]
        return [load_bf16(builder, start, c) for c in range(0, width, LANES)]

    def _select(builder, predicate, a, b):
        return builder.select(builder.fcmp_ordered(predicate, a, b), a, b)

    def _lanes_reduce(builder, vector, predicate):
        """min ("<") or max (">") of a vector's lanes, halving it by shuffles."""
        width = LANES
        while width > 1:
            width //= 2
            upper = builder.shuffle_vector(vector, vector, ir.Constant(VI32, [width + i if i < width else i
                                                                               for i in range(LANES)]))
            vector = _select(builder, predicate, vector, upper)
        return builder.extract_element(vector, ir.Constant(ir.IntType(32), 0))

    def make_row_range(width: int):
        @intrinsic
        def row_range(typingctx, src, r, check):
            def codegen(context, builder, signature, args):
                src_type, _, check_type = signature.args
                values = _row(context, builder, src_type, args[0], args[1], width)
                low, high = values[0], values[0]
                sums = builder.fsub(values[0], values[0])
                for vector in values[1:]:
                    low, high = _select(builder, "<", low, vector), _select(builder, ">", high, vector)
                    sums = builder.fadd(sums, builder.fsub(vector, vector))
                check_at = at(builder, item(context, builder, check_type, args[2],
                                            [context.get_constant(types.intp, 0)]), 0, VF)
                builder.store(builder.fadd(builder.load(check_at, align=4), sums), check_at, align=4)
                pair = [_lanes_reduce(builder, low, "<"), _lanes_reduce(builder, high, ">")]
                return context.make_tuple(builder, signature.return_type, pair)
            return types.UniTuple(types.float32, 2)(src, r, check), codegen
        return row_range

    def make_row_codes(width: int):
        @intrinsic
        def row_codes(typingctx, src, r, low, inverse, codes, out_row):
            def codegen(context, builder, signature, args):
                src_type, _, _, _, codes_type, _ = signature.args
                values = _row(context, builder, src_type, args[0], args[1], width)
                low_v, inverse_v = splat(builder, args[2]), splat(builder, args[3])
                half, zero, top = (splat(builder, ir.Constant(F32, v)) for v in (0.5, 0.0, 255.5))
                out = item(context, builder, codes_type, args[4], [args[5], context.get_constant(types.intp, 0)])
                bytes16 = ir.VectorType(ir.IntType(8), LANES)
                for c, vector in enumerate(values):
                    scaled = builder.fadd(builder.fmul(builder.fsub(vector, low_v), inverse_v), half)
                    clamped = _select(builder, "<", _select(builder, ">", scaled, zero), top)
                    code = builder.trunc(builder.fptosi(clamped, VI32), bytes16)
                    builder.store(code, at(builder, out, c * LANES, bytes16), align=1)
                return context.get_dummy_value()
            return types.none(src, r, low, inverse, codes, out_row), codegen
        return row_codes


if llvm_vectors.AVAILABLE:
    def _make_row_decode(width: int, store):
        """`row_decode(codes, p, t, low, step, out)`: value = code * step + low in float32 (the product,
        then the sum: no FMA, as the reference), handed for each 16 values to
        `store(builder, value, target, c)`, target pointing at out[p, t, 0]."""
        @intrinsic
        def row_decode(typingctx, codes, p, t, low, step, out):
            def codegen(context, builder, signature, args):
                codes_type, _, _, _, _, out_type = signature.args
                zero = context.get_constant(types.intp, 0)
                source = item(context, builder, codes_type, args[0], [args[1], args[2], zero])
                target = item(context, builder, out_type, args[5], [args[1], args[2], zero])
                low_v, step_v = splat(builder, args[3]), splat(builder, args[4])
                bytes16 = ir.VectorType(ir.IntType(8), LANES)
                for c in range(0, width, LANES):
                    code = builder.load(at(builder, source, c, bytes16), align=1)
                    store(builder, builder.fadd(builder.fmul(builder.uitofp(code, VF), step_v), low_v), target, c)
                return context.get_dummy_value()
            return types.none(codes, p, t, low, step, out), codegen
        return row_decode

    def _store_bf16(builder, value, target, c):
        """Rounded to the nearest even bf16 (finite values), as llvm_bits.bf16_bits rounds one value."""
        bits = builder.bitcast(value, VI32)
        odd = builder.and_(builder.lshr(bits, ir.Constant(VI32, [16] * LANES)), ir.Constant(VI32, [1] * LANES))
        rounded = builder.add(builder.add(bits, ir.Constant(VI32, [0x7FFF] * LANES)), odd)
        halves = ir.VectorType(ir.IntType(16), LANES)
        top = builder.trunc(builder.lshr(rounded, ir.Constant(VI32, [16] * LANES)), halves)
        builder.store(top, at(builder, target, c, halves), align=2)

    def _store_f32_streaming(builder, value, target, c):
        store = builder.store(value, at(builder, target, c, VF), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))

    def make_row_decode_bf16(width: int):
        """`row_decode(codes, p, t, low, step, out)`: out[p, t, j] = bf16(code * step + low), the
        float32 product and sum without FMA (as the reference), rounded to nearest even."""
        return _make_row_decode(width, _store_bf16)

    def make_row_decode_f32(width: int):
        """`row_decode(codes, p, t, low, step, out)`: out[p, t, j] = code * step + low in float32
        (product, then sum: no FMA, as the reference), written with streaming stores: out's rows
        must start on 64-byte boundaries; call `store_fence()` before the rows are handed on.
        Streaming stores skip reading each line before writing it and do not evict the caches'
        contents for data the decode side reads much later: reading the float32 destination in
        would be a large share of a transfer's memory traffic, and both processes share the
        machine's memory bandwidth."""
        return _make_row_decode(width, _store_f32_streaming)

    @intrinsic
    def store_fence(typingctx):
        """sfence: the streaming stores before it are visible before any store after it."""
        def codegen(context, builder, signature, args):
            function = builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(function, [])
            return context.get_dummy_value()
        return types.none(), codegen

    def make_prefetch_row(width: int):
        """`prefetch_row(src, r)`: ask for row r's cache lines, into every cache level (src 2-D,
        rows of `width` float32 or bf16 values; r must be a row of src)."""
        @intrinsic
        def prefetch_row(typingctx, src, r):
            def codegen(context, builder, signature, args):
                start = item(context, builder, signature.args[0], args[0], [args[1], context.get_constant(types.intp, 0)])
                byte_pointer = ir.PointerType(ir.IntType(8))
                function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [byte_pointer] + [ir.IntType(32)] * 3), "llvm.prefetch.p0")
                line = 64 // (4 if signature.args[0].dtype == types.float32 else 2)
                for c in range(0, width, line):
                    pointer = builder.bitcast(builder.gep(start, [ir.Constant(ir.IntType(64), c)]), byte_pointer)
                    builder.call(function, [pointer] + [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)])
                return context.get_dummy_value()
            return types.none(src, r), codegen
        return prefetch_row
