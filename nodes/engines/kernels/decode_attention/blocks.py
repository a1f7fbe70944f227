"""Hand-built LLVM vector code for decode attention: 16 keys at a time, every query head of a GQA group.

Contract (only where `AVAILABLE`: `kernels.cpu.probe().numba`; called from numba-compiled code only;
bf16 values are uint16 bit patterns; every array's last dimension contiguous):
- `make_qk_block(group, head_dim)` returns an intrinsic `qk(q, first, keys, j0, scale, scores, tops)`:
  for i < group and j < 16, `scores[i, j0 + j] = scale * dot(q[first + i], keys[j0 + j])` (q float32
  [rows, head_dim], keys bf16 [n, head_dim]) and `tops[i, :] = max(tops[i, :], those 16 scores)`
  lane by lane (tops float32 [group, 16]), so the softmax needs no pass of its own for the maximum.
- `make_pv_block(group, head_dim)` returns `pv(weights, values, j0, acc)`:
  `acc[i] += sum_j weights[i, j0 + j] * values[j0 + j]` (acc float32 [group, head_dim]).
- `make_prefetch_block(head_dim, element_bytes=2)` returns `prefetch(rows, j0)`: requests rows
  j0..j0+15's cache lines (rows back to back), one request a line and no index arithmetic.
- `f32=True` (widening variants): keys and values are float32 rows (decode_attention.f32's cache).
- `pairs=True` (only where `PAIRS`: llvm_rows.AVAILABLE): qk takes q as bf16 bits (the same rounded
  values) and multiplies it with the keys by vdpbf16ps; pv rounds the 16 weights to bf16 (nearest
  even, as torch's SDPA and prefill_attention.tiled feed P to the second product) and multiplies
  pairs of weights with value rows interleaved by word unpacks (natural order again in `acc`).
`head_dim` must be a multiple of 16. Keys j0..j0+15 must exist: the caller runs the last partial
block with plain loops.

Why by hand: numba's key-by-key loops reduce every dot product across the lanes (a shuffle tree per
key and head) and keep the accumulators in memory (they may alias the cache, as far as LLVM knows).
Here the 16 keys' partial sums are reduced together, one tree level at a time, into one vector of 16
scores, and the accumulators stay in registers. Pairs exist because on CPUs with AVX512-BF16 but no
AMX the float32 kernel is bound by its FMAs, and vdpbf16ps does twice the multiply-adds.
"""

from __future__ import annotations

from nodes.engines.kernels.jit import NUMBA as AVAILABLE
from nodes.engines.kernels.llvm_rows import AVAILABLE as PAIRS

LANES = 16    # float32 lanes of an AVX-512 vector
BLOCK = 16    # keys a call handles: one reduced vector of scores
PAIR_LANES = 32   # bf16 values of one 64-byte vector: 16 pairs

if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_vectors import (
        I32,
        I64,
        VF,
        VI32,
        at,
        dpbf16,
        index,
        item,
        load_bf16,
        splat,
    )
    from nodes.engines.kernels.llvm_vectors import call as _call_intrinsic

    if PAIRS:
        from nodes.engines.kernels.llvm_rows import to_bf16

    def _call(builder, name, *args):
        return _call_intrinsic(builder, name, VF, *args)

    def _dot_partial(builder, query, key):
        """A key's dot product with a query head (float32 vectors), as 16 lane sums."""
        partial = builder.fmul(query[0], key[0])
        for c in range(1, len(key)):
            partial = _call(builder, "llvm.fma.v16f32", query[c], key[c], partial)
        return partial

    def _combine(builder, left, right, level):
        """Two vectors of 2**(level-1) keys' partial sums each (LANES >> (level-1) lanes a key, in
        key order) -> one of 2**level keys, LANES >> level lanes a key: pairwise lane sums."""
        size = LANES >> level
        starts = range(0, 2 * LANES, 2 * size)
        low = ir.Constant(VI32, [s + i for s in starts for i in range(size)])
        high = ir.Constant(VI32, [s + size + i for s in starts for i in range(size)])
        return builder.fadd(builder.shuffle_vector(left, right, low), builder.shuffle_vector(left, right, high))

    def _pairs_dot(builder, query, key):
        """A key's dot product with a query head (bf16 pair vectors), as 16 lane sums."""
        partial = ir.Constant(VF, None)
        for q_pairs, k_pairs in zip(query, key, strict=True):
            partial = dpbf16(builder, partial, q_pairs, k_pairs)
        return partial

    def _load_f32(builder, pointer, offset):
        return builder.load(at(builder, pointer, offset, VF), align=4)

    def make_qk_block(group: int, head_dim: int, pairs: bool = False, f32: bool = False):
        width = PAIR_LANES if pairs else LANES   # q and key values a vector holds
        chunks = head_dim // width

        def load_vector(builder, row, offset):
            if pairs:
                return builder.load(at(builder, row, offset, VI32), align=2)
            return builder.load(at(builder, row, offset, VF), align=4)

        def load_key(builder, row, offset):
            if pairs:
                return load_vector(builder, row, offset)
            return (_load_f32 if f32 else load_bf16)(builder, row, offset)

        dot = _pairs_dot if pairs else _dot_partial

        @intrinsic
        def qk_block(typingctx, q, first, keys, j0, scale, scores, tops):
            def codegen(context, builder, signature, args):
                q_type, _, keys_type, _, _, scores_type, tops_type = signature.args
                q_array, first_index, keys_array, j0_index, scale_value, scores_array, tops_array = args
                zero = index(context, 0)
                queries = []
                for i in range(group):
                    row = item(context, builder, q_type, q_array, [builder.add(first_index, index(context, i)), zero])
                    queries.append([load_vector(builder, row, c * width) for c in range(chunks)])
                key_row = item(context, builder, keys_type, keys_array, [j0_index, zero])
                stacks = [[] for _ in range(group)]   # per head: (level, vector), a binary counter of keys
                for j in range(BLOCK):
                    key = [load_key(builder, key_row, j * head_dim + c * width) for c in range(chunks)]
                    for i in range(group):
                        partial = dot(builder, queries[i], key)
                        level, stack = 0, stacks[i]
                        while stack and stack[-1][0] == level:   # reduce as soon as a pair is complete
                            level += 1
                            partial = _combine(builder, stack.pop()[1], partial, level)
                        stack.append((level, partial))
                scale_vector = splat(builder, scale_value)
                for i in range(group):
                    (_, sums), = stacks[i]
                    scaled = builder.fmul(sums, scale_vector)
                    out = item(context, builder, scores_type, scores_array, [index(context, i), j0_index])
                    builder.store(scaled, at(builder, out, 0, VF), align=4)
                    top = at(builder, item(context, builder, tops_type, tops_array, [index(context, i), zero]), 0, VF)
                    builder.store(_call(builder, "llvm.maxnum.v16f32", builder.load(top, align=4), scaled), top, align=4)
                return context.get_dummy_value()
            return types.none(q, first, keys, j0, scale, scores, tops), codegen
        return qk_block

    def make_pv_block(group: int, head_dim: int, pairs: bool = False, f32: bool = False):
        return _make_pv_pairs(group, head_dim) if pairs else _make_pv_widening(group, head_dim, f32)

    def _pv_operands(context, builder, signature, args, group):
        """A pv block's weights and values types, pointers to its accumulator rows, and index 0."""
        weights_type, values_type, _, acc_type = signature.args
        zero = index(context, 0)
        acc_rows = [item(context, builder, acc_type, args[3], [index(context, i), zero]) for i in range(group)]
        return weights_type, values_type, acc_rows, zero

    def _make_pv_widening(group: int, head_dim: int, f32: bool = False):
        chunks = head_dim // LANES
        load_value = _load_f32 if f32 else load_bf16

        @intrinsic
        def pv_block(typingctx, weights, values, j0, acc):
            def codegen(context, builder, signature, args):
                weights_type, values_type, acc_rows, zero = _pv_operands(context, builder, signature, args, group)
                weights_array, values_array, j0_index, _ = args
                sums = [[builder.load(at(builder, acc_rows[i], c * LANES, VF), align=4) for c in range(chunks)]
                        for i in range(group)]
                weight_rows = [item(context, builder, weights_type, weights_array, [index(context, i), j0_index])
                               for i in range(group)]
                value_row = item(context, builder, values_type, values_array, [j0_index, zero])
                for j in range(BLOCK):
                    value = [load_value(builder, value_row, j * head_dim + c * LANES) for c in range(chunks)]
                    for i in range(group):
                        weight = builder.load(builder.gep(weight_rows[i], [ir.Constant(I64, j)], inbounds=True), align=4)
                        weight = splat(builder, weight)
                        for c in range(chunks):
                            sums[i][c] = _call(builder, "llvm.fma.v16f32", weight, value[c], sums[i][c])
                for i in range(group):
                    for c in range(chunks):
                        builder.store(sums[i][c], at(builder, acc_rows[i], c * LANES, VF), align=4)
                return context.get_dummy_value()
            return types.none(weights, values, j0, acc), codegen
        return pv_block

    # Word unpacks of value rows a and b (32 bf16 each, four 128-bit lanes of 8): dword 4L + t of
    # the low unpack is (a, b) at dimension 8L + t, of the high unpack at 8L + 4 + t.
    _UNPACK = [[w + 32 * r for L in range(4) for t in range(4) for w, r in ((8 * L + t + 4 * h, 0), (8 * L + t + 4 * h, 1))]
               for h in range(2)]
    # acc's natural vectors (dimensions 0-15 and 16-31 of a 32-wide chunk) from (low, high) sums, and back.
    def _unpacked_index(dim: int) -> int:
        """Where dimension `dim` of a 32-wide chunk sits in the (low, high) unpack-ordered sums."""
        block, half, t = dim // 8, (dim % 8) // 4, dim % 4
        return 16 * half + 4 * block + t

    _TO_NATURAL = [[_unpacked_index(16 * n + k) for k in range(LANES)] for n in range(2)]
    _FROM_NATURAL = [[8 * L + t + 4 * h for L in range(4) for t in range(4)] for h in range(2)]

    def _make_pv_pairs(group: int, head_dim: int):
        chunks = head_dim // PAIR_LANES
        vi16x32 = ir.VectorType(ir.IntType(16), PAIR_LANES)
        vi32x8 = ir.VectorType(I32, 8)
        vi32x32 = ir.VectorType(I32, PAIR_LANES)   # a shuffle mask of 32 words

        @intrinsic
        def pv_block(typingctx, weights, values, j0, acc):
            def codegen(context, builder, signature, args):
                weights_type, values_type, acc_rows, zero = _pv_operands(context, builder, signature, args, group)
                weights_array, values_array, j0_index, _ = args
                sums = []   # sums[i][c][h]: head i, chunk c, low (0) or high (1) unpack order
                for row in acc_rows:
                    natural = [builder.load(at(builder, row, v * LANES, VF), align=4) for v in range(2 * chunks)]
                    sums.append([[builder.shuffle_vector(natural[2 * c], natural[2 * c + 1], ir.Constant(VI32, mask))
                                  for mask in _FROM_NATURAL] for c in range(chunks)])
                weight_pairs = []   # head i's 16 weights as 8 dwords of bf16 pairs
                for i in range(group):
                    row = item(context, builder, weights_type, weights_array, [index(context, i), j0_index])
                    rounded = to_bf16(builder, builder.load(at(builder, row, 0, VF), align=4))
                    weight_pairs.append(builder.bitcast(rounded, vi32x8))
                value_row = item(context, builder, values_type, values_array, [j0_index, zero])
                for p in range(BLOCK // 2):
                    splats = [builder.shuffle_vector(w, ir.Constant(vi32x8, None), ir.Constant(VI32, [p] * LANES))
                              for w in weight_pairs]
                    for c in range(chunks):
                        a, b = (builder.load(at(builder, value_row, (2 * p + r) * head_dim + c * PAIR_LANES, vi16x32),
                                             align=2) for r in range(2))
                        for h, mask in enumerate(_UNPACK):
                            value_pairs = builder.bitcast(builder.shuffle_vector(a, b, ir.Constant(vi32x32, mask)), VI32)
                            for i in range(group):
                                sums[i][c][h] = dpbf16(builder, sums[i][c][h], value_pairs, splats[i])
                for i, row in enumerate(acc_rows):
                    for c in range(chunks):
                        low, high = sums[i][c]
                        for n, mask in enumerate(_TO_NATURAL):
                            natural = builder.shuffle_vector(low, high, ir.Constant(VI32, mask))
                            builder.store(natural, at(builder, row, (2 * c + n) * LANES, VF), align=4)
                return context.get_dummy_value()
            return types.none(weights, values, j0, acc), codegen
        return pv_block

    def make_prefetch_block(head_dim: int, element_bytes: int = 2):
        """An intrinsic `prefetch(rows, j0)`: requests the cache lines of rows j0..j0+15 of a bf16
        (or `element_bytes` wide) [n, head_dim] array whose rows lie back to back (a slot cache's K or
        V stream), for reading, into every level. Pure address arithmetic: the caller checks that
        the rows exist."""
        num_lines = BLOCK * head_dim * element_bytes // 64
        byte_pointer = ir.PointerType(ir.IntType(8))

        @intrinsic
        def prefetch_block(typingctx, rows, j0):
            def codegen(context, builder, signature, args):
                rows_type = signature.args[0]
                start = builder.bitcast(item(context, builder, rows_type, args[0], [args[1], index(context, 0)]),
                                        byte_pointer)
                function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [byte_pointer] + [I32] * 3), "llvm.prefetch.p0")
                flags = [ir.Constant(I32, v) for v in (0, 3, 1)]   # read, keep in every level, data
                for line in range(num_lines):
                    builder.call(function, [builder.gep(start, [ir.Constant(I64, 64 * line)]), *flags])
                return context.get_dummy_value()
            return types.none(rows, j0), codegen
        return prefetch_block
