"""Causal prefill attention on AMX tiles, or on their AVX512-BF16 emulation (bf16 in, float32 scores
and sums, bf16 out).

Contract (only where `can_attend(...)`; bf16 values as uint16 bit patterns; head_dim 64):
`prefill_attention(q, keys, values, start, out, workspace)` attends a prefill span's queries
q [heads, rows, 64] (query i at position start + i, RoPE applied) over the keys and values
[kv_heads, capacity, 64] of its own sequence, positions 0..start + i (its own rows already written,
as norm_rope's `rope_and_cache` leaves them; slots past the span are never read), heads sharing KV
heads in GQA groups of heads // kv_heads, and writes out [rows, heads * 64]. `workspace` is
`Workspace(num_keys)` for at least start + rows keys, meant to be reused call after call (a fresh
allocation per call makes the kernel's time vary from one process to the next). `TILES` is the tile
API it runs on: amx_tiles where `kernels.cpu.probe().amx`, else soft_tiles where `.avx512bf16`
(`ON_AMX` says which; kernels.dispatch decides whether either serves). Numerics: scores are q . k in
float32 (tdpbf16ps), softmax in float32 (llvm_rows), its weights rounded to bf16 for the second
product (as torch's CPU flash attention does for bf16), the output divided by the float32 sum and
rounded to bf16; the two tile APIs differ only by float32 summation order.

How: per KV head, the keys are packed once into tiles of 16 keys x 32 dims in the pair order
tdpbf16ps reads its second operand in and the values into tiles of 32 keys x 16 dims (two keys'
values interleaved); per 16 queries, scores for every visible key go to a float32 block (two dots a
16-key tile), the softmax writes each row's bf16 weights over the first half of its own scores, and
weights x values accumulate in four tiles (the 64 output dims) across the keys. Two passes over the
block instead of an online softmax: no rescaling of accumulator tiles. docs/KERNELS.md has the
measured gain over torch's SDPA (`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels import amx_tiles, llvm_rows, soft_tiles

HEAD_DIM = 64
KEYS = 16          # keys a score tile holds (and queries a block holds)
PAIR_KEYS = 32     # keys a value tile holds
# Scores rows get 16 floats more than the widest softmax: a row stride of a multiple of 4 KiB would
# put all 16 rows in the same L1 sets.
ROW_PADDING = 16


class Workspace:
    """Scratch for spans of up to `num_keys` keys: packed keys and values, one block of scores."""

    def __init__(self, num_keys: int) -> None:
        self.num_keys = num_keys
        key_tiles, value_tiles = -(-num_keys // KEYS), -(-num_keys // PAIR_KEYS)
        self.packed_keys = amx_tiles.aligned_zeros((key_tiles, 2, KEYS, 2 * KEYS), np.uint16)
        self.packed_values = amx_tiles.aligned_zeros((value_tiles, 4, KEYS, 2 * KEYS), np.uint16)
        self.scores = amx_tiles.aligned_zeros((KEYS, value_tiles * PAIR_KEYS + ROW_PADDING), np.float32)
        self.queries = amx_tiles.aligned_zeros((KEYS, HEAD_DIM), np.uint16)   # a last block of < 16 queries
        self.acc = amx_tiles.aligned_zeros((KEYS, HEAD_DIM), np.float32)      # a block's 64 outputs in float32


TILES = amx_tiles if amx_tiles.AVAILABLE else soft_tiles if soft_tiles.AVAILABLE else None
ON_AMX = TILES is amx_tiles


def can_attend(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    return (TILES is not None and llvm_rows.AVAILABLE and head_dim == HEAD_DIM
            and num_heads % num_kv_heads == 0)


if TILES is not None and llvm_rows.AVAILABLE:
    CONFIG, configure, release = TILES.CONFIG, TILES.configure, TILES.release
    tile_dot, tile_load, tile_store, tile_zero = TILES.tile_dot, TILES.tile_load, TILES.tile_store, TILES.tile_zero
    from nodes.engines.kernels.jit import inline as _inline
    from nodes.engines.kernels.jit import njit_numpy_errors as _njit_numpy_errors
    from nodes.engines.kernels.llvm_rows import CAUSAL_ROWS, causal_softmax_rows, scaled_row

    # Tiles: 0-3 output accumulators (16 dims each), 4-5 queries (dims 0-31, 32-63) then weights,
    # 6-7 keys or values, 7 also the score accumulator.
    _zero0, _zero1, _zero2, _zero3 = (tile_zero(t) for t in range(4))
    _store_out0, _store_out1, _store_out2, _store_out3 = (tile_store(t) for t in range(4))
    _load_q0, _load_q1 = tile_load(4), tile_load(5)
    _load_kv0, _load_kv1 = tile_load(6), tile_load(7)
    _zero_scores, _store_scores = tile_zero(7), tile_store(7)
    _score0, _score1 = tile_dot(7, 4, 6), tile_dot(7, 5, 6)
    _weigh0, _weigh1, _weigh2, _weigh3 = tile_dot(0, 4, 6), tile_dot(1, 4, 7), tile_dot(2, 4, 6), tile_dot(3, 4, 7)

    @_inline
    def _pack_keys(keys, g, num_keys, packed):  # pragma: no cover - runs compiled
        """packed[b, c, r, 2j + p] = keys[g, 16b + j, 32c + 2r + p] (0 past num_keys)."""
        for b in range((num_keys + KEYS - 1) // KEYS):
            for c in range(2):
                for r in range(KEYS):
                    for j in range(KEYS):
                        key = b * KEYS + j
                        inside = key < num_keys
                        packed[b, c, r, 2 * j] = keys[g, key, 32 * c + 2 * r] if inside else 0
                        packed[b, c, r, 2 * j + 1] = keys[g, key, 32 * c + 2 * r + 1] if inside else 0

    @_inline
    def _pack_values(values, g, num_keys, packed):  # pragma: no cover - runs compiled
        """packed[b, d, r, 2j + p] = values[g, 32b + 2r + p, 16d + j] (0 past num_keys)."""
        for b in range((num_keys + PAIR_KEYS - 1) // PAIR_KEYS):
            for d in range(4):
                for r in range(KEYS):
                    for p in range(2):
                        key = b * PAIR_KEYS + 2 * r + p
                        if key < num_keys:
                            for j in range(KEYS):
                                packed[b, d, r, 2 * j + p] = values[g, key, 16 * d + j]
                        else:
                            for j in range(KEYS):
                                packed[b, d, r, 2 * j + p] = 0

    @_inline
    def _load_queries(q, h, q0, rows, block, row_bytes):  # pragma: no cover - runs compiled
        """Tiles 4-5 <- queries q0..q0 + 15 of head h (rows past the span as zeros, from `block`)."""
        if rows == KEYS:
            _load_q0(q[h], q0, 0, row_bytes)
            _load_q1(q[h], q0, 32, row_bytes)
        else:
            block[:rows] = q[h, q0:q0 + rows]
            block[rows:] = 0
            _load_q0(block, 0, 0, row_bytes)
            _load_q1(block, 0, 32, row_bytes)

    def _attend(q, keys, values, start, out, packed_keys, packed_values, scores, block, acc):  # pragma: no cover
        num_heads, num_rows = q.shape[0], q.shape[1]
        group = num_heads // keys.shape[0]
        num_keys = start + num_rows
        weights = scores.view(np.uint16)   # row i's bf16 weights: the first half of its scores' bytes
        totals = np.empty(KEYS, np.float32)
        scale = np.float32(1.0 / np.sqrt(HEAD_DIM))
        score_stride = np.int64(4 * scores.shape[1])
        row_bytes, tile_bytes, acc_stride = np.int64(2 * HEAD_DIM), np.int64(4 * KEYS), np.int64(4 * HEAD_DIM)
        configure(CONFIG)
        for g in range(keys.shape[0]):
            _pack_keys(keys, g, num_keys, packed_keys)
            _pack_values(values, g, num_keys, packed_values)
            for h in range(g * group, (g + 1) * group):
                for q0 in range(0, num_rows, KEYS):
                    rows = min(KEYS, num_rows - q0)
                    _load_queries(q, h, q0, rows, block, row_bytes)
                    visible = start + q0 + rows            # keys the block's last query sees
                    for b in range((visible + KEYS - 1) // KEYS):
                        _zero_scores()
                        _load_kv0(packed_keys[b, 0], 0, 0, tile_bytes)
                        _score0()
                        _load_kv0(packed_keys[b, 1], 0, 0, tile_bytes)
                        _score1()
                        _store_scores(scores, 0, b * KEYS, score_stride)
                    width = (visible + PAIR_KEYS - 1) // PAIR_KEYS * PAIR_KEYS
                    # Row i sees start + q0 + i + 1 keys; rows past the span (a last block of
                    # fewer than 16 queries, zeros) see the block's keys, and their outputs are dropped.
                    for i0 in range(0, KEYS, CAUSAL_ROWS):
                        causal_softmax_rows(scores, weights, i0, start + q0 + 1, visible, width, scale, totals)
                    _zero0()
                    _zero1()
                    _zero2()
                    _zero3()
                    for b in range(width // PAIR_KEYS):
                        _load_q0(weights, 0, b * PAIR_KEYS, score_stride)
                        _load_kv0(packed_values[b, 0], 0, 0, tile_bytes)
                        _load_kv1(packed_values[b, 1], 0, 0, tile_bytes)
                        _weigh0()
                        _weigh1()
                        _load_kv0(packed_values[b, 2], 0, 0, tile_bytes)
                        _load_kv1(packed_values[b, 3], 0, 0, tile_bytes)
                        _weigh2()
                        _weigh3()
                    _store_out0(acc, 0, 0, acc_stride)
                    _store_out1(acc, 0, 16, acc_stride)
                    _store_out2(acc, 0, 32, acc_stride)
                    _store_out3(acc, 0, 48, acc_stride)
                    for i in range(rows):
                        scaled_row(acc, i, np.float32(1.0) / totals[i], out, q0 + i, h * HEAD_DIM)
        release()

    # One name per tile API: numba's disk cache files are named after the function, and its index
    # knows the CPU but not which tile API a process chose (PDBUS_NO_AMX on an AMX machine).
    _attend.__name__ = _attend.__qualname__ = "_attend_amx" if ON_AMX else "_attend_soft"
    _attend = _njit_numpy_errors(_attend)


def prefill_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, out: np.ndarray,
                      workspace: Workspace) -> None:
    assert workspace.num_keys >= start + q.shape[1], "the workspace is smaller than the span's keys"
    _attend(q, keys, values, start, out, workspace.packed_keys, workspace.packed_values, workspace.scores,
            workspace.queries, workspace.acc)


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types fast_path passes."""
    q = np.zeros((2, 3, HEAD_DIM), np.uint16)
    cache = np.zeros((2, 1, 8, HEAD_DIM), np.uint16)
    prefill_attention(q, cache[0], cache[1], 2, np.zeros((3, 2 * HEAD_DIM), np.uint16), Workspace(8))
