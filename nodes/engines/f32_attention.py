"""numba decode attention for float32 slot caches: the KV write and GQA softmax attention in one pass.

Contract (`AVAILABLE` where numba is importable; float32 numpy arrays, last dimensions contiguous):
`decode_attention(q, k, v, positions, slots, cache, layer, out)` takes one decode token per row:
q [rows, heads, head_dim] (RoPE applied), k and v [rows, kv_heads, head_dim]; it writes k and v
into `cache` [layers, slots, 2, kv_heads, capacity, head_dim] at the row's position of its slot,
and writes to out [rows, heads * head_dim] the softmax attention of each query head over keys
0..position of its slot, query heads sharing KV heads in GQA groups of heads // kv_heads (scores
scaled by 1 / sqrt(head_dim), exp and sums in float32). No mask: each row reads exactly its own
keys. `warmup()` compiles it. LlamaRunner runs float32 pure decode steps' attention on it.

Why: torch's batched SDPA with a length mask took 5.5 ms of a 34 ms float32 batch-1 step on a
Zen 4 (30 layers; 23.6 MB of KV at ~4 GB/s). Here the query heads of a KV head go through its keys
and values together, so each K and V row is read once per step, and nothing is masked or padded.
The softmax is bf16_attention's (its exp within 3e-7 relative of exp), so results differ from
SDPA's by float32 rounding.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.bf16_kernels import AVAILABLE

if AVAILABLE:
    import numba

    from nodes.engines.bf16_attention import LOWEST, _softmax
    from nodes.engines.bf16_blocks import LANES

    FASTMATH = {"reassoc", "contract", "nsz", "arcp"}   # scores are finite: no mask, no padding

    @numba.njit(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)
    def decode_attention(q, k, v, positions, slots, cache, layer, out):  # pragma: no cover - runs compiled
        rows, num_heads, head_dim = q.shape
        num_kv_heads = k.shape[1]
        group = num_heads // num_kv_heads
        scale = np.float32(1.0 / np.sqrt(head_dim))
        max_keys = 1
        for m in range(rows):
            max_keys = max(max_keys, positions[m] + 1)
        scores = np.empty((group, max_keys), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        tops = np.empty((group, LANES), np.float32)
        inverse = np.empty(group, np.float32)
        for m in range(rows):
            pos, slot = positions[m], slots[m]
            for g in range(num_kv_heads):
                cache[layer, slot, 0, g, pos] = k[m, g]
                cache[layer, slot, 1, g, pos] = v[m, g]
            for g in range(num_kv_heads):
                keys, values = cache[layer, slot, 0, g], cache[layer, slot, 1, g]
                num_keys = pos + 1
                for j in range(num_keys):
                    for i in range(group):
                        dot = np.float32(0.0)
                        for d in range(head_dim):
                            dot += q[m, g * group + i, d] * keys[j, d]
                        scores[i, j] = dot * scale
                tops[:, :] = LOWEST
                _softmax(scores, tops, group, 0, num_keys, inverse)   # bf16_attention's, on float32 scores
                for i in range(group):
                    acc[i, :] = 0.0
                    for j in range(num_keys):
                        weight = scores[i, j]
                        for d in range(head_dim):
                            acc[i, d] += weight * values[j, d]
                    for d in range(head_dim):
                        out[m, (g * group + i) * head_dim + d] = acc[i, d] * inverse[i]


def warmup() -> None:
    """Compile (or load from the disk cache) the kernel for the array types the runner passes."""
    if not AVAILABLE:
        raise RuntimeError("numba is not installed")
    q = np.zeros((1, 2, 4), np.float32)
    kv = np.zeros((1, 1, 4), np.float32)
    cache = np.zeros((1, 1, 2, 1, 4, 4), np.float32)
    index = np.zeros(1, np.int64)
    decode_attention(q, kv, kv, index, index, cache, 0, np.zeros((1, 8), np.float32))
