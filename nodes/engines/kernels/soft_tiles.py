"""AMX's tile operations in AVX512-BF16 vectors, for CPUs without AMX: prefill_attention.tiled's
kernel runs on them.

Contract: `AVAILABLE` is llvm_rows.AVAILABLE (`kernels.cpu.probe().avx512bf16`: numba and a CPU
with AVX512-BF16). The same names and arguments as amx_tiles' tile API, with the same results up to
float32 summation order: `tile_load(t)` / `tile_store(t)` (intrinsics `op(array, i, j, stride_bytes)`:
16 rows of 64 bytes at array[i, j], rows `stride_bytes` apart), `tile_zero(t)`, `tile_dot(acc, a, b)`
(acc's 16 x 16 float32 += a's 16 rows of 16 bf16 pairs against b's 16 rows of 16 pairs, as tdpbf16ps
pairs them), and `configure(CONFIG)` / `release()`, which do nothing here. Only numba-compiled
code may call them. The eight "tiles" are one process-wide 8 KiB buffer (a global of the compiled
kernel): one thread at a time may run a kernel that uses them, as the engine's node loop does.

How: a tile dot keeps b's 16 rows in vector registers and, for each row of acc, multiplies the
broadcast pair k of a's row with b's row k (vdpbf16ps, llvm_vectors.dpbf16) 16 times: 256
vdpbf16ps and 16 accumulator loads and stores for 8192 products; loads and stores copy rows. It
runs GROUP_ROWS rows at a time with k outermost (independent accumulators, so no vdpbf16ps waits
on the one before it; each row still sums over k in order) and broadcasts each pair from memory (a
load-port op; from a register it costs a shuffle).

Why: prefill_attention.tiled's algorithm (keys packed once per KV head, two passes over a block of
scores, no rescaling) needs only these four operations from the hardware, so CPUs without AMX run
it too instead of torch's SDPA; docs/KERNELS.md has its measured gain (`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.llvm_rows import AVAILABLE

NUM_TILES = 8
ROWS = 16            # rows a tile holds
ROW_WORDS = 16       # 32-bit words (bf16 pairs or float32) a row holds: 64 bytes
GROUP_ROWS = 8       # accumulator rows a tile dot keeps in registers at once (with b's 16 rows)
CONFIG = np.zeros(64, np.uint8)   # configure's argument, unused here (AMX's palette)

if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from nodes.engines.kernels.llvm_vectors import I32, LANES, VF, VI32, dpbf16, item, splat

    assert LANES == ROW_WORDS
    _ROW = VI32           # a tile row: 16 bf16 pairs, or (as VF) 16 float32
    _STATE = ir.ArrayType(_ROW, NUM_TILES * ROWS)
    _STATE_NAME = "pdbus_soft_tiles"

    def _row(builder, tile: int, row: int):
        """A pointer to row `row` of tile `tile` in the kernel's tile buffer."""
        module = builder.module
        try:
            state = module.get_global(_STATE_NAME)
        except KeyError:
            state = ir.GlobalVariable(module, _STATE, _STATE_NAME)
            state.linkage = "internal"
            state.initializer = ir.Constant(_STATE, None)
            state.align = 64
        return builder.gep(state, [ir.Constant(I32, 0), ir.Constant(I32, tile * ROWS + row)])

    def _address(context, builder, array_type, array, i, j):
        return builder.bitcast(item(context, builder, array_type, array, [i, j]), ir.PointerType(ir.IntType(8)))

    def _rows(builder, start, stride):
        """Pointers to 16 rows of 64 bytes, `stride` bytes apart from `start`."""
        return [builder.bitcast(builder.gep(start, [builder.mul(stride, ir.Constant(stride.type, r))]),
                                ir.PointerType(_ROW)) for r in range(ROWS)]

    def _copy_op(tile: int, into_tile: bool):
        """An intrinsic `op(array, i, j, stride)`: 16 rows of 64 bytes from array[i, j] into the tile,
        or from the tile to there."""
        @intrinsic
        def op(typingctx, array, i, j, stride):
            def codegen(context, builder, signature, args):
                start = _address(context, builder, signature.args[0], args[0], args[1], args[2])
                for r, place in enumerate(_rows(builder, start, args[3])):
                    if into_tile:
                        builder.store(builder.load(place, align=1), _row(builder, tile, r), align=64)
                    else:
                        builder.store(builder.load(_row(builder, tile, r), align=64), place, align=1)
                return context.get_dummy_value()
            return types.none(array, i, j, stride), codegen
        return op

    def tile_load(tile: int):
        return _copy_op(tile, into_tile=True)

    def tile_store(tile: int):
        return _copy_op(tile, into_tile=False)

    def tile_zero(tile: int):
        @intrinsic
        def zero(typingctx):
            def codegen(context, builder, signature, args):
                for r in range(ROWS):
                    builder.store(ir.Constant(_ROW, None), _row(builder, tile, r), align=64)
                return context.get_dummy_value()
            return types.none(), codegen
        return zero

    def tile_dot(acc: int, a: int, b: int):
        @intrinsic
        def dot(typingctx):
            def codegen(context, builder, signature, args):
                b_rows = [builder.load(_row(builder, b, k), align=64) for k in range(ROWS)]
                # Eight rows at a time, k outermost: eight independent accumulators, so no vdpbf16ps
                # waits on the one before it (a row's 16 in one chain would); each row still sums
                # over k in order.
                for first in range(0, ROWS, GROUP_ROWS):
                    rows = range(first, first + GROUP_ROWS)
                    targets = [builder.bitcast(_row(builder, acc, m), ir.PointerType(VF)) for m in rows]
                    sums = [builder.load(target, align=64) for target in targets]
                    a_rows = [builder.bitcast(_row(builder, a, m), ir.PointerType(I32)) for m in rows]
                    for k in range(ROWS):
                        for i, a_row in enumerate(a_rows):
                            # Broadcast from memory, a load-port op (from a register it is a shuffle).
                            word = builder.load(builder.gep(a_row, [ir.Constant(I32, k)]), align=4)
                            sums[i] = dpbf16(builder, sums[i], splat(builder, word), b_rows[k])
                    for target, total in zip(targets, sums, strict=True):
                        builder.store(total, target, align=64)
                return context.get_dummy_value()
            return types.none(), codegen
        return dot

    @intrinsic
    def configure(typingctx, config):
        def codegen(context, builder, signature, args):
            return context.get_dummy_value()
        return types.none(config), codegen

    @intrinsic
    def release(typingctx):
        def codegen(context, builder, signature, args):
            return context.get_dummy_value()
        return types.none(), codegen
