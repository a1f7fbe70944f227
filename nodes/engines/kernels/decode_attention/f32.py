"""numba decode attention for float32 slot caches: the KV write and GQA softmax attention in one pass.

Contract (only where `AVAILABLE`: `kernels.cpu.probe().numba`; float32 numpy arrays, last dimensions
contiguous): `decode_attention(q, k, v, positions, slots, cache, layer, out, prefetch)` takes one
decode token per row: q [rows, heads, head_dim] (RoPE applied), k and v [rows, kv_heads, head_dim];
it writes k and v into `cache` [layers, slots, 2, kv_heads, capacity, head_dim] at the row's position
of its slot (in place), and writes to out [rows, heads * head_dim] the softmax attention of each
query head over keys 0..position of its slot, query heads sharing KV heads in GQA groups of
heads // kv_heads (scores scaled by 1 / sqrt(head_dim), exp and sums in float32). No mask: each row
reads exactly its own keys. `prefetch` makes it request each K and V stream's lines a block ahead,
which changes no result. `warmup()` compiles it; `prefetch_pays()` says whether to prefetch on this
machine. kernels.dispatch decides whether it serves (`decode_attention` "f32").
Numerics: the softmax is decode_attention.bf16's (its exp within 3e-7 relative of exp, weights
NEGLIGIBLE_GAP below the maximum 0), so results differ from SDPA's by float32 rounding; a row's
result does not depend on the other rows of the batch.

Why: it is decode_attention.bf16's kernel on float32 rows. The query heads of a KV head go through
its keys and values together, so each K and V row is read once per step, and nothing is masked or
padded; for SmolLM2's shape it runs 16 keys at a time on decode_attention.blocks' float32 variants,
with two (row, KV head) units interleaved so the K and V streams run side by side, and the same
optional prefetching, timed once a process. docs/KERNELS.md has the measured gain over compiled
torch (`make bench-engine`).
"""

from __future__ import annotations

import functools

import numpy as np

from nodes.engines.kernels.decode_attention.bf16 import BLOCK_GROUP, BLOCK_HEAD_DIM, timed_prefetch_pays
from nodes.engines.kernels.jit import NUMBA as AVAILABLE

if AVAILABLE:
    import numba

    from nodes.engines.kernels.decode_attention import blocks as vector_blocks
    from nodes.engines.kernels.decode_attention.bf16 import LOWEST, _softmax
    from nodes.engines.kernels.decode_attention.blocks import BLOCK, LANES

    FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # scores are finite: no mask, no padding
    _qk_block = vector_blocks.make_qk_block(BLOCK_GROUP, BLOCK_HEAD_DIM, f32=True)
    _pv_block = vector_blocks.make_pv_block(BLOCK_GROUP, BLOCK_HEAD_DIM, f32=True)
    _prefetch_block = vector_blocks.make_prefetch_block(BLOCK_HEAD_DIM, element_bytes=4)

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _scores(q, first, group, keys, start, num_keys, scale, scores):  # pragma: no cover - runs compiled
        """scores[i, j] = q[first + i] . keys[j] * scale for keys start..num_keys - 1, one at a time."""
        head_dim = keys.shape[1]
        for j in range(start, num_keys):
            for i in range(group):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[first + i, d] * keys[j, d]
                scores[i, j] = dot * scale

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _weighted_values(weights, group, values, start, num_keys, acc):  # pragma: no cover - runs compiled
        """acc[i] += weights[i, j] * values[j] for j in start..num_keys - 1, one value row at a time."""
        head_dim = values.shape[1]
        for j in range(start, num_keys):
            for i in range(group):
                weight = weights[i, j]
                for d in range(head_dim):
                    acc[i, d] += weight * values[j, d]

    @numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)
    def decode_attention(q, k, v, positions, slots, cache, layer, out, prefetch):  # pragma: no cover - runs compiled
        rows, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        group = num_heads // num_kv_heads
        blocks = group == BLOCK_GROUP and head_dim == BLOCK_HEAD_DIM
        scale = np.float32(1.0 / np.sqrt(head_dim))
        max_keys = 1
        for m in range(rows):   # every row's own k and v first: a row reads only its own slot
            max_keys = max(max_keys, positions[m] + 1)
            for g in range(num_kv_heads):
                cache[layer, slots[m], 0, g, positions[m]] = k[m, g]
                cache[layer, slots[m], 1, g, positions[m]] = v[m, g]
        # Two of each: unit u's scores are computed while unit u - 1's values are weighted.
        scores = np.empty((2, group, max_keys), np.float32)
        tops = np.empty((2, group, LANES), np.float32)
        inverse = np.empty((2, group), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        units = rows * num_kv_heads   # unit u: row u // num_kv_heads, KV head u % num_kv_heads
        for u in range(units + 1):
            now, before = u % 2, (u + 1) % 2
            m, g = min(u, units - 1) // num_kv_heads, min(u, units - 1) % num_kv_heads
            pm, pg = max(u - 1, 0) // num_kv_heads, max(u - 1, 0) % num_kv_heads
            keys, values = cache[layer, slots[m], 0, g], cache[layer, slots[pm], 1, pg]
            num_keys = positions[m] + 1 if u < units else 0
            num_values = positions[pm] + 1 if u > 0 else 0
            key_blocks = num_keys // BLOCK if blocks else 0
            value_blocks = num_values // BLOCK if blocks else 0
            tops[now] = LOWEST
            acc[:, :] = 0.0
            # Views taken once a unit (numba reference-counts each one it makes).
            q_heads, now_scores, now_tops, weights = q[m], scores[now], tops[now], scores[before]
            first = g * group
            for b in range(max(key_blocks, value_blocks)):   # the K and V streams side by side
                ahead = (b + 1) * BLOCK
                if prefetch and ahead + BLOCK <= num_keys:
                    _prefetch_block(keys, ahead)
                if prefetch and ahead + BLOCK <= num_values:
                    _prefetch_block(values, ahead)
                if b < key_blocks:
                    _qk_block(q_heads, first, keys, b * BLOCK, scale, now_scores, now_tops)
                if b < value_blocks:
                    _pv_block(weights, values, b * BLOCK, acc)
            if u > 0:
                _weighted_values(weights, group, values, value_blocks * BLOCK, num_values, acc)
                for i in range(group):
                    for d in range(head_dim):
                        out[pm, (pg * group + i) * head_dim + d] = acc[i, d] * inverse[before, i]
            if u < units:
                _scores(q_heads, first, group, keys, key_blocks * BLOCK, num_keys, scale, now_scores)
                _softmax(now_scores, now_tops, group, key_blocks * BLOCK, num_keys, inverse[now])


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types the runner passes."""
    if not AVAILABLE:
        raise RuntimeError("numba is not installed")
    q = np.zeros((1, 2, 4), np.float32)
    kv = np.zeros((1, 1, 4), np.float32)
    cache = np.zeros((1, 1, 2, 1, 4, 4), np.float32)
    index = np.zeros(1, np.int64)
    decode_attention(q, kv, kv, index, index, cache, 0, np.zeros((1, 8), np.float32), False)


@functools.cache
def prefetch_pays(num_bytes: int = 192 << 20, rounds: int = 5) -> bool:
    """decode_attention.bf16.prefetch_pays for this kernel, over a synthetic batch-of-16, 512-key float32
    cache of about `num_bytes` (`PDBUS_ATTENTION_PREFETCH=0|1` answers for both kernels)."""
    def attend_layers():
        heads, kv_heads, head_dim, rows, keys = BLOCK_GROUP * 3, 3, BLOCK_HEAD_DIM, 16, 512
        layers = max(1, num_bytes // (rows * 2 * kv_heads * keys * head_dim * 4))
        cache = np.ones((layers, rows, 2, kv_heads, keys, head_dim), np.float32)
        q = np.ones((rows, heads, head_dim), np.float32)
        kv = np.ones((rows, kv_heads, head_dim), np.float32)
        positions, slots = np.full(rows, keys - 1, np.int64), np.arange(rows, dtype=np.int64)
        out = np.empty((rows, heads * head_dim), np.float32)

        def run(prefetch: bool) -> None:
            for layer in range(layers):
                decode_attention(q, kv, kv, positions, slots, cache, layer, out, prefetch)
        return run
    return timed_prefetch_pays(attend_layers, rounds)
