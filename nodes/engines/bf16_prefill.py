"""numba kernels for the elementwise steps of a bf16 prefill pass (wrapped for torch by Bf16Gemv).

Contract (numpy arrays, bf16 values as uint16 bit patterns; only where `bf16_kernels.AVAILABLE`):
- `rms_norm(x, norm_w, eps, out)`: llama.rms_norm of every row of x into out, rounded as its bf16
  branch rounds (float32 statistics, bf16 scale, bf16 after the scale and after the weight).
- `rope_and_cache(qkv, cos, sin, start, num_heads, q_out, cache)`: RoPE on the q and k heads of a
  span's rows (positions start..start + rows - 1; rotate-half tables, its sign in `sin`, rounded as
  llama.apply_rope: round(round(x * cos) + swapped * sin)), q written to q_out [num_heads, rows,
  head_dim] (the layout SDPA reads), k and v into `cache` [2, kv_heads, capacity, head_dim] at
  those positions.
`warmup()` compiles both (Bf16Gemv.create calls it with the other kernels').

Why: after the linear layers and the causal attention, RMSNorm and RoPE were the next costs of a
bf16 prefill pass: the torch versions make four passes over the rows for a norm (norm, scale,
multiply, multiply) and three for RoPE (multiply, concatenate, addcmul), then copy k and v into the
cache. These kernels read each value once and write it once, where it is needed, with the same
roundings (bit-identical; tests/nodes/engines/test_bf16_prefill.py). `make bench-engine` measured a
1024-token prefill at 2685 tok/s with them, 2435 in the run before.
"""

from __future__ import annotations

import numpy as np

from nodes.engines.bf16_kernels import AVAILABLE

if AVAILABLE:
    from nodes.engines.bf16_kernels import _bf16_bits, _njit, _norm_scale, _normed, _rope_pair

    @_njit
    def rms_norm(x, norm_w, eps, out):  # pragma: no cover - runs compiled
        for m in range(x.shape[0]):
            scale = _norm_scale(x, m, eps)
            for k in range(x.shape[1]):
                out[m, k] = _bf16_bits(_normed(x, m, k, norm_w, scale))

    @_njit
    def rope_and_cache(qkv, cos, sin, start, num_heads, q_out, cache):  # pragma: no cover - runs compiled
        num_kv_heads, head_dim = cache.shape[1], cache.shape[3]
        half = head_dim // 2
        v_base = (num_heads + num_kv_heads) * head_dim
        rotated = np.empty((num_heads + num_kv_heads, head_dim), np.float32)
        for t in range(qkv.shape[0]):
            pos = start + t
            # Rotate into float32 scratch first: loads and stores of different types, which LLVM
            # knows cannot alias, so the loop vectorises (uint16 in and out did not).
            for h in range(num_heads + num_kv_heads):
                for d in range(half):
                    rotated[h, d], rotated[h, d + half] = _rope_pair(qkv, t, h * head_dim, d, half, cos, sin, pos)
            for h in range(num_heads):
                for d in range(head_dim):
                    q_out[h, t, d] = _bf16_bits(rotated[h, d])
            for g in range(num_kv_heads):
                for d in range(head_dim):
                    cache[0, g, pos, d] = _bf16_bits(rotated[num_heads + g, d])
                    cache[1, g, pos, d] = qkv[t, v_base + g * head_dim + d]


def warmup() -> None:
    """Compile (or load from the disk cache) both kernels for the array types Bf16Gemv passes."""
    x = np.zeros((2, 8), np.uint16)
    rms_norm(x, x[0], 1e-5, x.copy())
    heads, kv_heads, head_dim = 2, 1, 4
    qkv = np.zeros((2, (heads + 2 * kv_heads) * head_dim), np.uint16)
    table = np.zeros((4, head_dim), np.uint16)
    cache = np.zeros((3, 2, kv_heads, 4, head_dim), np.uint16)[1]   # one layer of a cache, as in use
    rope_and_cache(qkv, table, table, 0, heads, np.zeros((heads, 2, head_dim), np.uint16), cache)
