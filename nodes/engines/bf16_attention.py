"""numba decode attention for bf16 slot caches: RoPE, KV write and GQA softmax attention in one pass.

Contract (`bf16_kernels.AVAILABLE` must hold; numpy arrays, bf16 values as uint16 bit patterns):
`decode_attention(qkv, cos, sin, positions, slots, cache, layer, num_heads, out)` takes one decode
token per row of `qkv` [rows, (heads + 2 kv_heads) * head_dim]: RoPE on its q and k (rotate-half
tables, rotate-half's sign in `sin`, rounded as llama.apply_rope: round(round(x * cos) + swapped *
sin)), its k and v written into `cache` [layers, slots, 2, kv_heads, capacity, head_dim] at its
position, and softmax attention of its q heads over keys 0..position of its slot, written to `out`
[rows, heads * head_dim]. No mask: each row reads exactly its own keys. `warmup()` compiles it.
LlamaRunner runs every pure bf16 decode step's attention on it, at any batch size.

Why a kernel: the query heads sharing a KV head go through its keys and values together, so each K
and V row is read from memory (and widened to float32) once per step instead of once per head, and
nothing is gathered, masked or padded. At batch 32 and context 512 a step reads 377 MB of KV, and
SDPA over the slot cache ran at about half the single-core read bandwidth; this kernel, with the
K/V rows it will read next requested ahead (`PREFETCH_ROWS`), took 44 ms a step there against
SDPA's 55 (ad-hoc microbenchmark; `make bench-engine` measures the steps). The softmax uses its own
exp (`_exp_nonpositive`): numba's np.exp is a scalar libm call per score (3.8 ns here); this one is
plain float arithmetic that LLVM vectorises (0.34 ns), within 3e-7 relative of exp in float64.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.bf16_kernels import AVAILABLE

# Scores are finite (no mask, no padding), so the NaN/inf assumptions are safe and let the max and
# sum reductions vectorise.
FASTMATH = {"reassoc", "contract", "nnan", "ninf", "nsz", "arcp"}
# Rows of K (and of V) requested this far ahead of the one being read: at batch 32 the step streams
# 377 MB of KV, and the hardware prefetcher alone left the kernel waiting on memory for half its
# time (44 vs 69 ms a step at batch 32 in an ad-hoc microbenchmark; 55 ms for SDPA there).
PREFETCH_ROWS = 16

if AVAILABLE:
    import numba

    from bus.numba_bits import bits_f32
    from nodes.engines.bf16_kernels import _bf16_bits, _prefetch_ahead, _rope_pair, _round, _to_f32

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _exp_nonpositive(x):  # pragma: no cover - runs compiled
        """exp(x) for x <= 0: 2**n * p(r), x = n ln2 + r (Cody-Waite), p a degree-7 Taylor series."""
        x = x if x > np.float32(-87.0) else np.float32(-87.0)   # below: 0 to float32's precision
        n = np.float32(np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5)))
        r = x - n * np.float32(0.693145751953125)
        r = r - n * np.float32(1.428606765330187e-06)
        p = np.float32(1.0 / 720.0)
        for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
            p = p * r + np.float32(c)
        return p * bits_f32(np.uint32(np.int32(n) + np.int32(127)) << np.uint32(23))

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _rope_and_write(qkv, m, cos, sin, pos, slot, cache, layer, num_heads, q):  # pragma: no cover
        num_kv_heads, head_dim = cache.shape[3], cache.shape[5]
        half = head_dim // 2
        for h in range(num_heads + num_kv_heads):
            for d in range(half):
                low, high = _rope_pair(qkv, m, h * head_dim, d, half, cos, sin, pos)
                q[h, d], q[h, d + half] = _round(low), _round(high)
        v_base = (num_heads + num_kv_heads) * head_dim
        for g in range(num_kv_heads):
            for d in range(head_dim):
                cache[layer, slot, 0, g, pos, d] = _bf16_bits(q[num_heads + g, d])
                cache[layer, slot, 1, g, pos, d] = qkv[m, v_base + g * head_dim + d]

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _scores(q, first, group, keys, num_keys, scale, scores, row):  # pragma: no cover - runs compiled
        """scores[i, j] = q[first + i] . keys[j] * scale; three heads a KV head (SmolLM2, and many
        GQA models) take one pass over each key with three accumulators."""
        head_dim = keys.shape[1]
        for j in range(num_keys):
            _prefetch_ahead(keys, j, PREFETCH_ROWS)
            if group == 3:
                d0, d1, d2 = np.float32(0.0), np.float32(0.0), np.float32(0.0)
                for d in range(head_dim):
                    k = _to_f32(keys[j, d])
                    d0 += q[first, d] * k
                    d1 += q[first + 1, d] * k
                    d2 += q[first + 2, d] * k
                scores[0, j], scores[1, j], scores[2, j] = d0 * scale, d1 * scale, d2 * scale
                continue
            for d in range(head_dim):
                row[d] = _to_f32(keys[j, d])
            for i in range(group):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[first + i, d] * row[d]
                scores[i, j] = dot * scale

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _softmax(scores, group, num_keys):  # pragma: no cover - runs compiled
        for i in range(group):
            top = scores[i, 0]
            for j in range(num_keys):
                top = max(top, scores[i, j])
            total = np.float32(0.0)
            for j in range(num_keys):
                weight = _exp_nonpositive(scores[i, j] - top)
                scores[i, j] = weight
                total += weight
            inverse = np.float32(1.0) / total
            for j in range(num_keys):
                scores[i, j] *= inverse

    @numba.njit(inline="always", fastmath=FASTMATH)
    def _weighted_values(scores, group, values, num_keys, acc, row):  # pragma: no cover - runs compiled
        head_dim = values.shape[1]
        acc[:, :] = 0.0
        for j in range(num_keys):
            _prefetch_ahead(values, j, PREFETCH_ROWS)
            if group == 3:
                w0, w1, w2 = scores[0, j], scores[1, j], scores[2, j]
                for d in range(head_dim):
                    v = _to_f32(values[j, d])
                    acc[0, d] += w0 * v
                    acc[1, d] += w1 * v
                    acc[2, d] += w2 * v
                continue
            for d in range(head_dim):
                row[d] = _to_f32(values[j, d])
            for i in range(group):
                weight = scores[i, j]
                for d in range(head_dim):
                    acc[i, d] += weight * row[d]

    @numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)
    def decode_attention(qkv, cos, sin, positions, slots, cache, layer, num_heads, out):  # pragma: no cover
        num_kv_heads, head_dim = cache.shape[3], cache.shape[5]
        group = num_heads // num_kv_heads
        scale = np.float32(1.0 / np.sqrt(head_dim))
        max_keys = 1
        for m in range(positions.shape[0]):
            max_keys = max(max_keys, positions[m] + 1)
        q = np.empty((num_heads + num_kv_heads, head_dim), np.float32)
        scores = np.empty((group, max_keys), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        row = np.empty(head_dim, np.float32)
        for m in range(qkv.shape[0]):
            pos, slot = positions[m], slots[m]
            _rope_and_write(qkv, m, cos, sin, pos, slot, cache, layer, num_heads, q)
            for g in range(num_kv_heads):
                first = g * group
                _scores(q, first, group, cache[layer, slot, 0, g], pos + 1, scale, scores, row)
                _softmax(scores, group, pos + 1)
                _weighted_values(scores, group, cache[layer, slot, 1, g], pos + 1, acc, row)
                for i in range(group):
                    for d in range(head_dim):
                        out[m, (first + i) * head_dim + d] = _bf16_bits(acc[i, d])


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types the runner passes."""
    heads, kv_heads, head_dim = 2, 1, 4
    qkv = np.zeros((1, (heads + 2 * kv_heads) * head_dim), np.uint16)
    table = np.zeros((4, head_dim), np.uint16)
    index = np.zeros(1, np.int64)
    cache = np.zeros((1, 1, 2, kv_heads, 4, head_dim), np.uint16)
    decode_attention(qkv, table, table, index, index, cache, 0, heads, np.zeros((1, heads * head_dim), np.uint16))
