"""numba kernels for the elementwise steps of a bf16 prefill pass, and their torch-facing wrappers.

Contract (bf16 CPU tensors; callable only where `bf16_kernels.AVAILABLE` holds, as `Bf16Gemv`):
- `rms_norm(x, weight_bits, eps) -> Tensor`: llama.rms_norm of every row of x, rounded as its bf16
  branch rounds (float32 statistics, bf16 scale, bf16 after the scale and after the weight).
- `rope_and_cache(qkv, cos_bits, sin_bits, start, num_heads, cache) -> q`: RoPE on the q and k heads
  of a span's rows (positions start..start + rows - 1; rotate-half tables, its sign in `sin`,
  rounded as llama.apply_rope: round(round(x * cos) + swapped * sin)), k and v written into `cache`
  [2, kv_heads, capacity, head_dim] at those positions, and q returned as a new contiguous
  [num_heads, rows, head_dim] tensor, the layout SDPA reads.
`warmup()` compiles both.

Why: after the linear layers and the causal attention, RMSNorm and RoPE were the next costs of a
bf16 prefill pass: the torch versions make four passes over the rows for a norm (norm, scale,
multiply, multiply) and three for RoPE (multiply, concatenate, addcmul), then copy k and v into the
cache. These kernels read each value once and write it once, where it is needed, with the same
roundings (bit-identical; tests/nodes/engines/test_bf16_prefill.py). `make bench-engine` measured a
1024-token prefill at 2685 tok/s with them, 2435 in the run before.
"""

from __future__ import annotations

import numpy as np
import torch

from nodes.engines.bf16_gemv import bits
from nodes.engines.bf16_kernels import AVAILABLE

if AVAILABLE:
    from nodes.engines.bf16_kernels import _bf16_bits, _njit, _round, _to_f32

    @_njit
    def _rms_norm(x, norm_w, eps, out):  # pragma: no cover - runs compiled
        size = x.shape[1]
        for m in range(x.shape[0]):
            squares = np.float32(0.0)
            for k in range(size):
                v = _to_f32(x[m, k])
                squares += v * v
            scale = _round(np.float32(1.0) / np.sqrt(squares / np.float32(size) + np.float32(eps)))
            for k in range(size):
                out[m, k] = _bf16_bits(_round(_to_f32(x[m, k]) * scale) * _to_f32(norm_w[k]))

    @_njit
    def _rope_and_cache(qkv, cos, sin, start, num_heads, q_out, cache):  # pragma: no cover - runs compiled
        num_kv_heads, head_dim = cache.shape[1], cache.shape[3]
        half = head_dim // 2
        v_base = (num_heads + num_kv_heads) * head_dim
        rotated = np.empty((num_heads + num_kv_heads, head_dim), np.float32)
        for t in range(qkv.shape[0]):
            pos = start + t
            # Rotate into float32 scratch first: loads and stores of different types, which LLVM
            # knows cannot alias, so the loop vectorises.
            for h in range(num_heads + num_kv_heads):
                base = h * head_dim
                for d in range(half):
                    a, b = _to_f32(qkv[t, base + d]), _to_f32(qkv[t, base + d + half])
                    rotated[h, d] = _round(a * _to_f32(cos[pos, d])) + b * _to_f32(sin[pos, d])
                    rotated[h, d + half] = _round(b * _to_f32(cos[pos, d + half])) + a * _to_f32(sin[pos, d + half])
            for h in range(num_heads):
                for d in range(head_dim):
                    q_out[h, t, d] = _bf16_bits(rotated[h, d])
            for g in range(num_kv_heads):
                for d in range(head_dim):
                    cache[0, g, pos, d] = _bf16_bits(rotated[num_heads + g, d])
                    cache[1, g, pos, d] = qkv[t, v_base + g * head_dim + d]


def rms_norm(x: torch.Tensor, weight_bits: np.ndarray, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _rms_norm(bits(x), weight_bits, eps, bits(out))
    return out


def rope_and_cache(qkv: torch.Tensor, cos_bits: np.ndarray, sin_bits: np.ndarray, start: int, num_heads: int,
                   cache: torch.Tensor) -> torch.Tensor:
    q = torch.empty(num_heads, qkv.shape[0], cache.shape[-1], dtype=qkv.dtype)
    # One layer of a sequence's cache, written in place through its strides.
    cache_bits = cache.view(torch.int16).numpy().view(np.uint16)
    _rope_and_cache(bits(qkv), cos_bits, sin_bits, start, num_heads, bits(q), cache_bits)
    return q


def warmup() -> None:
    """Compile (or load from the disk cache) both kernels for the array types the runner passes."""
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    rms_norm(x, bits(x[0]), 1e-5)
    heads, kv_heads, head_dim = 2, 1, 4
    qkv = torch.zeros(2, (heads + 2 * kv_heads) * head_dim, dtype=torch.bfloat16)
    table = bits(torch.zeros(4, head_dim, dtype=torch.bfloat16))
    rope_and_cache(qkv, table, table, 0, heads, torch.zeros(3, 2, kv_heads, 4, head_dim, dtype=torch.bfloat16)[1])
