"""Causal prefill attention on AMX tiles (bf16 in, float32 scores and sums, bf16 out).

Contract (only where `amx_tiles.AVAILABLE`; bf16 values as uint16 bit patterns; head_dim 64):
`prefill_attention(q, keys, values, start, out)` attends a prefill span's queries
q [heads, rows, 64] (query i at position start + i, RoPE applied) over the keys and values
[kv_heads, capacity, 64] of its own sequence, positions 0..start + i (its own rows already written,
as `rope_and_cache` leaves them), heads sharing KV heads in GQA groups of heads // kv_heads, and
writes out [rows, heads * 64]. Scores are q . k in float32 (tdpbf16ps), softmax in float32 with
bf16_kernels' vectorised exp, its weights rounded to bf16 for the second product (as torch's CPU
flash attention does for bf16), the output divided by the float32 sum and rounded to bf16.
`warmup()` compiles it.

How: per KV head, the keys are packed once into tiles of 16 keys x 32 dims in the pair order
tdpbf16ps reads its second operand in (each tile a 16 x 16 transpose of bf16 pairs) and the values
into tiles of 32 keys x 16 dims (two keys' values interleaved); per 16 queries, scores for every
visible key go to a float32 block (two dots a 16-key tile), the softmax runs on that block, and
the weights x values accumulate in four tiles (the 64 output dims) across the keys. Two passes over
the block (scores, then weights) instead of an online softmax: no rescaling of the accumulators.

Why: torch's SDPA spent 177 of a 1024-token bf16 prefill's 485 ms here (about 220 GFLOP/s); the
products are a small share of that on AMX, the softmax the rest.
"""

from __future__ import annotations

import numpy as np

from nodes.engines import amx_tiles

HEAD_DIM = 64
KEYS = 16          # keys a score tile holds (and queries a block holds)
PAIR_KEYS = 32     # keys a value tile holds
LOWEST = np.float32(-3.0e38)

if amx_tiles.AVAILABLE:
    import numba

    from nodes.engines.amx_tiles import CONFIG, configure, release, tile_dot, tile_load, tile_store, tile_zero
    from nodes.engines.bf16_kernels import FASTMATH, _bf16_bits, _exp_nonpositive, _inline

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
        for b in range(packed.shape[0]):
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
        for b in range(packed.shape[0]):
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
    def _softmax_row(scores, weights, i, num_visible, width, scale, lanes):  # pragma: no cover
        """weights[i, :num_visible] = bf16(exp((s - max) * scale)), 0 up to width; returns the sum.
        The max runs lane-wise over 16-key blocks (numba's scalar max loop does not vectorise)."""
        full = num_visible // KEYS
        for k in range(KEYS):
            lanes[k] = LOWEST
        for b in range(full):
            for k in range(KEYS):
                value = scores[i, b * KEYS + k]
                lanes[k] = value if value > lanes[k] else lanes[k]
        top = LOWEST
        for k in range(KEYS):
            top = lanes[k] if lanes[k] > top else top
        for j in range(full * KEYS, num_visible):
            top = scores[i, j] if scores[i, j] > top else top
        total = np.float32(0.0)
        for j in range(num_visible):
            weight = _exp_nonpositive((scores[i, j] - top) * scale)
            weights[i, j] = _bf16_bits(weight)
            total += weight
        for j in range(num_visible, width):
            weights[i, j] = 0
        return total

    @numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH, error_model="numpy")
    def prefill_attention(q, keys, values, start, out):  # pragma: no cover - runs compiled
        num_heads, num_rows = q.shape[0], q.shape[1]
        num_kv_heads = keys.shape[0]
        group = num_heads // num_kv_heads
        num_keys = start + num_rows
        key_tiles = (num_keys + KEYS - 1) // KEYS
        value_tiles = (num_keys + PAIR_KEYS - 1) // PAIR_KEYS
        packed_keys = np.empty((key_tiles, 2, KEYS, 2 * KEYS), np.uint16)
        packed_values = np.empty((value_tiles, 4, KEYS, 2 * KEYS), np.uint16)
        scores = np.empty((KEYS, key_tiles * KEYS), np.float32)
        weights = np.zeros((KEYS, value_tiles * PAIR_KEYS), np.uint16)
        block = np.zeros((KEYS, HEAD_DIM), np.uint16)
        acc = np.empty((KEYS, HEAD_DIM), np.float32)
        totals = np.empty(KEYS, np.float32)
        lanes = np.empty(KEYS, np.float32)
        scale = np.float32(1.0 / np.sqrt(HEAD_DIM))
        score_stride, weight_stride = np.int64(4 * scores.shape[1]), np.int64(2 * weights.shape[1])
        row_bytes, tile_bytes, acc_stride = np.int64(2 * HEAD_DIM), np.int64(4 * KEYS), np.int64(4 * HEAD_DIM)
        configure(CONFIG)
        for g in range(num_kv_heads):
            _pack_keys(keys, g, num_keys, packed_keys)
            _pack_values(values, g, num_keys, packed_values)
            for h in range(g * group, (g + 1) * group):
                for q0 in range(0, num_rows, KEYS):
                    rows = min(KEYS, num_rows - q0)
                    block[:rows] = q[h, q0:q0 + rows]
                    block[rows:] = 0
                    visible = start + q0 + rows            # keys the block's last query sees
                    _load_q0(block, 0, 0, row_bytes)
                    _load_q1(block, 0, 32, row_bytes)
                    for b in range((visible + KEYS - 1) // KEYS):
                        _zero_scores()
                        _load_kv0(packed_keys[b, 0], 0, 0, tile_bytes)
                        _score0()
                        _load_kv0(packed_keys[b, 1], 0, 0, tile_bytes)
                        _score1()
                        _store_scores(scores, 0, b * KEYS, score_stride)
                    width = (visible + PAIR_KEYS - 1) // PAIR_KEYS * PAIR_KEYS
                    for i in range(KEYS):
                        if i < rows:
                            totals[i] = _softmax_row(scores, weights, i, start + q0 + i + 1, width, scale, lanes)
                        else:
                            weights[i, :width] = 0
                    _zero0()
                    _zero1()
                    _zero2()
                    _zero3()
                    for b in range(width // PAIR_KEYS):
                        _load_q0(weights, 0, b * PAIR_KEYS, weight_stride)
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
                        inverse = np.float32(1.0) / totals[i]
                        for d in range(HEAD_DIM):
                            out[q0 + i, h * HEAD_DIM + d] = _bf16_bits(acc[i, d] * inverse)
        release()


def can_attend(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    return amx_tiles.AVAILABLE and head_dim == HEAD_DIM and num_heads % num_kv_heads == 0


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types Bf16Gemv passes."""
    q = np.zeros((2, 3, HEAD_DIM), np.uint16)
    cache = np.zeros((2, 1, 8, HEAD_DIM), np.uint16)
    prefill_attention(q, cache[0], cache[1], 2, np.zeros((3, 2 * HEAD_DIM), np.uint16))
