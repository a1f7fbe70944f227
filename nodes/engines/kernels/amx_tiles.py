"""Intel AMX tile matrix multiply (bf16 x bf16 -> float32) for numba, streaming packed weights.

Contract: `AVAILABLE` is `kernels.cpu.probe().amx` (numba, amx-tile and amx-bf16 on the CPU,
`PDBUS_NO_AMX` unset, and the tile data state granted to this process). Only then may `matmul` or
the tile intrinsics run. bf16 values are uint16 bit patterns.
- `pack(w)`: weights [N, K] with N and K multiples of 32 -> tiles [N/16, K/32, 16, 32]: tile (n, k)
  row r, column c holds w[16n + c // 2, 32k + 2r + c % 2] (the pair-interleaved order tdpbf16ps
  reads its second operand in). `can_pack(shape)` says whether a shape fits.
- `matmul(x, tiles, out)`: out = x @ w.T in float32 for x [rows, K] with rows 16 or 32 (pad with
  anything: each output row depends on its own row only), out [rows, N].
- For other tile kernels: `tile_load(t)`, `tile_store(t)` (intrinsics `op(array, i, j, stride_bytes)`
  at array[i, j]), `tile_zero(t)`, `tile_dot(acc, a, b)` (tdpbf16ps), `configure(CONFIG)` (every
  tile 16 rows of 64 bytes) and `release()`. `aligned_zeros` gives the page-aligned buffers tiles
  should load from and store to.

Why: decode steps of up to 32 tokens are bound by reading the weights once. This loop reads two
weight tile streams side by side (N blocks n and n + 1), which keeps more reads in flight than one,
and keeps both row blocks' accumulators in tiles across the whole K loop. Tiles: 0-3 accumulators
(rows 0-15 / 16-31 x N blocks n / n + 1), 4-5 rows of x, 6-7 weight tiles. Each step also requests
both streams' lines `PREFETCH_LINES` ahead (a tile row is one 64-byte line), which the hardware
prefetcher alone does not keep up with. docs/KERNELS.md has the measured gain over compiled torch
(`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.cpu import probe

MAX_ROWS = 32
TILE_ROWS = 16       # rows of x (and of the output) a tile holds
TILE_K = 32          # bf16 values of K a tile holds (64 bytes a row)
PREFETCH_LINES = 64  # four weight tiles ahead in each stream

AVAILABLE = probe().amx   # numba, AMX on the CPU, not masked, and the tile state granted

ALIGNMENT = 4096    # tile rows are 64-byte lines; numpy aligns its buffers only to 16 bytes


def aligned_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Zeros starting on a page boundary, for buffers that tiles load from or store to: from a
    misaligned buffer every 64-byte tile row splits across two cache lines, a measurable cost."""
    num_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(num_bytes + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + num_bytes].view(dtype).reshape(shape)


def can_pack(shape: tuple[int, int]) -> bool:
    return shape[0] % (2 * TILE_ROWS) == 0 and shape[1] % TILE_K == 0


def pack(w: np.ndarray) -> np.ndarray:
    n, k = w.shape
    assert can_pack((n, k)), f"AMX tiles need N and K multiples of 32, not {n} x {k}"
    tiles = w.reshape(n // TILE_ROWS, TILE_ROWS, k // TILE_K, TILE_K // 2, 2).transpose(0, 2, 3, 1, 4)
    return np.ascontiguousarray(tiles).reshape(n // TILE_ROWS, k // TILE_K, TILE_ROWS, TILE_K)


if AVAILABLE:
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from nodes.engines.kernels.bf16_scalar import _prefetch

    _I8, _I64 = ir.IntType(8), ir.IntType(64)
    _BYTES = ir.PointerType(_I8)

    def _call(builder, name, arg_types, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), arg_types), name)
        builder.call(function, args)

    def _pointer(context, builder, array_type, array, indices):
        data = context.make_array(array_type)(context, builder, array)
        item = cgutils.get_item_pointer(context, builder, array_type, data, indices, wraparound=False, boundscheck=False)
        return builder.bitcast(item, _BYTES)

    @intrinsic
    def _configure(typingctx, config):
        """ldtilecfg from a 64-byte palette-1 configuration."""
        def codegen(context, builder, signature, args):
            start = _pointer(context, builder, signature.args[0], args[0], [context.get_constant(types.intp, 0)])
            _call(builder, "llvm.x86.ldtilecfg", [_BYTES], [start])
            return context.get_dummy_value()
        return types.none(config), codegen

    @intrinsic
    def _release(typingctx):
        def codegen(context, builder, signature, args):
            _call(builder, "llvm.x86.tilerelease", [], [])
            return context.get_dummy_value()
        return types.none(), codegen

    def _tile_op(name: str, tile: int):
        """An intrinsic `op(array, i, j, stride_bytes)`: tileloadd64 or tilestored64 of `tile` at array[i, j]."""
        @intrinsic
        def op(typingctx, array, i, j, stride):
            def codegen(context, builder, signature, args):
                start = _pointer(context, builder, signature.args[0], args[0], [args[1], args[2]])
                _call(builder, name, [_I8, _BYTES, _I64], [ir.Constant(_I8, tile), start, args[3]])
                return context.get_dummy_value()
            return types.none(array, i, j, stride), codegen
        return op

    def _constant_op(name: str, *tiles: int):
        """An intrinsic without arguments on fixed tiles (tilezero, tdpbf16ps)."""
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, signature, args):
                _call(builder, name, [_I8] * len(tiles), [ir.Constant(_I8, t) for t in tiles])
                return context.get_dummy_value()
            return types.none(), codegen
        return op

    _zero0, _zero1, _zero2, _zero3 = (_constant_op("llvm.x86.tilezero", t) for t in range(4))
    _store0, _store1, _store2, _store3 = (_tile_op("llvm.x86.tilestored64", t) for t in range(4))
    _load_x0, _load_x1 = _tile_op("llvm.x86.tileloadd64", 4), _tile_op("llvm.x86.tileloadd64", 5)
    _load_w0, _load_w1 = _tile_op("llvm.x86.tileloadd64", 6), _tile_op("llvm.x86.tileloadd64", 7)
    _dot00, _dot01 = _constant_op("llvm.x86.tdpbf16ps", 0, 4, 6), _constant_op("llvm.x86.tdpbf16ps", 1, 4, 7)
    _dot10, _dot11 = _constant_op("llvm.x86.tdpbf16ps", 2, 5, 6), _constant_op("llvm.x86.tdpbf16ps", 3, 5, 7)

    def _config() -> np.ndarray:
        config = np.zeros(64, np.uint8)
        config[0] = 1                                      # palette 1
        config[16:32].view(np.uint16)[:8] = 2 * TILE_K     # bytes a row, every tile
        config[48:56] = TILE_ROWS                          # rows, every tile
        return config

    _CONFIG = _config()

    # For other tile kernels (prefill_attention.tiled): intrinsics on fixed tile numbers, and the config.
    def tile_load(tile: int):
        return _tile_op("llvm.x86.tileloadd64", tile)

    def tile_store(tile: int):
        return _tile_op("llvm.x86.tilestored64", tile)

    def tile_zero(tile: int):
        return _constant_op("llvm.x86.tilezero", tile)

    def tile_dot(acc: int, a: int, b: int):
        return _constant_op("llvm.x86.tdpbf16ps", acc, a, b)

    configure, release, CONFIG = _configure, _release, _CONFIG

    @numba.njit(cache=True, boundscheck=False, nogil=True)
    def matmul(x, tiles, out):  # pragma: no cover - runs compiled
        _configure(_CONFIG)
        two = x.shape[0] > TILE_ROWS
        x_stride, out_stride, tile_stride = np.int64(2 * x.shape[1]), np.int64(4 * out.shape[1]), np.int64(2 * TILE_K)
        lines = tiles.reshape(-1, TILE_K)          # a row of a tile is one cache line
        stream_lines = tiles.shape[1] * TILE_ROWS  # lines between stream n and stream n + 1
        for n in range(0, tiles.shape[0], 2):
            _zero0()
            _zero1()
            if two:
                _zero2()
                _zero3()
            for k in range(tiles.shape[1]):
                ahead = (n * tiles.shape[1] + k) * TILE_ROWS + PREFETCH_LINES
                for line in range(ahead, min(ahead + TILE_ROWS, lines.shape[0])):
                    _prefetch(lines, line, 0)
                for line in range(ahead + stream_lines, min(ahead + stream_lines + TILE_ROWS, lines.shape[0])):
                    _prefetch(lines, line, 0)
                _load_x0(x, 0, k * TILE_K, x_stride)
                _load_w0(tiles[n, k], 0, 0, tile_stride)
                _load_w1(tiles[n + 1, k], 0, 0, tile_stride)
                _dot00()
                _dot01()
                if two:
                    _load_x1(x, TILE_ROWS, k * TILE_K, x_stride)
                    _dot10()
                    _dot11()
            _store0(out, 0, n * TILE_ROWS, out_stride)
            _store1(out, 0, (n + 1) * TILE_ROWS, out_stride)
            if two:
                _store2(out, TILE_ROWS, n * TILE_ROWS, out_stride)
                _store3(out, TILE_ROWS, (n + 1) * TILE_ROWS, out_stride)
        _release()


def warmup() -> None:
    """Compile (or load from the disk cache) `matmul` for the array types its callers pass."""
    x = np.zeros((TILE_ROWS, TILE_K), np.uint16)
    tiles = pack(np.zeros((2 * TILE_ROWS, TILE_K), np.uint16))
    matmul(x, tiles, np.zeros((TILE_ROWS, 2 * TILE_ROWS), np.float32))
