"""Hand-built LLVM vector code for decode attention: 16 keys at a time, every query head of a GQA group.

Contract (only where `bf16_kernels.AVAILABLE`; called from numba-compiled code only; bf16 values
are uint16 bit patterns; every array's last dimension contiguous):
- `make_qk_block(group, head_dim)` returns an intrinsic
  `qk(q, first, keys, j0, scale, scores, tops)`: for i < group and j < 16,
  `scores[i, j0 + j] = scale * dot(q[first + i], keys[j0 + j])` (q float32 [rows, head_dim], keys
  bf16 [n, head_dim]) and `tops[i, :] = max(tops[i, :], those 16 scores)` lane by lane (tops float32
  [group, 16]), so the softmax needs no pass of its own for the maximum.
- `make_pv_block(group, head_dim)` returns `pv(weights, values, j0, acc)`:
  `acc[i] += sum_j weights[i, j0 + j] * values[j0 + j]` (acc float32 [group, head_dim]).
`head_dim` must be a multiple of 16. Keys j0..j0+15 must exist: the caller runs the last partial
block with plain loops.

Why by hand: numba's loops over one key at a time reduce every dot product across the vector
lanes (a shuffle tree per key and head) and keep the output accumulators in memory (they may alias
the cache, as far as LLVM knows). Here the 16 keys' lane-wise partial sums are reduced together,
one level of the tree at a time, ending in one vector of 16 scores; and the group's accumulators
stay in registers for the 16 values rows. That halved the kernel's in-cache time (ad-hoc timing,
2.4 -> 1.5 ms for 2 x 513 keys x 30 layers); `make bench-engine` measures whole decode steps.
"""

from __future__ import annotations

from nodes.engines.bf16_kernels import AVAILABLE

LANES = 16    # float32 lanes of an AVX-512 vector
BLOCK = 16    # keys a call handles: one reduced vector of scores

if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from bus.numba_vectors import I64, VF, VI32, at, index, item, load_bf16, splat
    from bus.numba_vectors import call as _call_intrinsic

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

    def make_qk_block(group: int, head_dim: int):
        chunks = head_dim // LANES

        @intrinsic
        def qk_block(typingctx, q, first, keys, j0, scale, scores, tops):
            def codegen(context, builder, signature, args):
                q_type, _, keys_type, _, _, scores_type, tops_type = signature.args
                q_array, first_index, keys_array, j0_index, scale_value, scores_array, tops_array = args
                zero = index(context, 0)
                queries = []
                for i in range(group):
                    row = item(context, builder, q_type, q_array, [builder.add(first_index, index(context, i)), zero])
                    queries.append([builder.load(at(builder, row, c * LANES, VF), align=4) for c in range(chunks)])
                key_row = item(context, builder, keys_type, keys_array, [j0_index, zero])
                stacks = [[] for _ in range(group)]   # per head: (level, vector), a binary counter of keys
                for j in range(BLOCK):
                    key = [load_bf16(builder, key_row, j * head_dim + c * LANES) for c in range(chunks)]
                    for i in range(group):
                        partial = _dot_partial(builder, queries[i], key)
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

    def make_pv_block(group: int, head_dim: int):
        chunks = head_dim // LANES

        @intrinsic
        def pv_block(typingctx, weights, values, j0, acc):
            def codegen(context, builder, signature, args):
                weights_type, values_type, _, acc_type = signature.args
                weights_array, values_array, j0_index, acc_array = args
                zero = index(context, 0)
                acc_rows = [item(context, builder, acc_type, acc_array, [index(context, i), zero]) for i in range(group)]
                sums = [[builder.load(at(builder, acc_rows[i], c * LANES, VF), align=4) for c in range(chunks)]
                        for i in range(group)]
                weight_rows = [item(context, builder, weights_type, weights_array, [index(context, i), j0_index])
                               for i in range(group)]
                value_row = item(context, builder, values_type, values_array, [j0_index, zero])
                for j in range(BLOCK):
                    value = [load_bf16(builder, value_row, j * head_dim + c * LANES) for c in range(chunks)]
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
