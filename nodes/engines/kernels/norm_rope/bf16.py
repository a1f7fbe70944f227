"""numba kernels for the elementwise steps of a bf16 pass of any size (wrapped for torch by
fast_path.Bf16FastPath).

Contract (only where `AVAILABLE`: `kernels.cpu.probe().numba`; numpy arrays, bf16 values as uint16
bit patterns):
- `rms_norm(x, norm_w, eps, out)`: llama_ops.rms_norm of every row of x into out, rounded as its bf16
  branch rounds (float32 statistics, bf16 scale, bf16 after the scale and after the weight).
- `rope_and_cache(qkv, cos, sin, start, num_heads, q_out, cache)`: RoPE on the q and k heads of a
  span's rows (positions start..start + rows - 1; rotate-half tables, its sign in `sin`, rounded as
  llama_ops.apply_rope: round(round(x * cos) + swapped * sin)), q written to q_out [num_heads, rows,
  head_dim] (the layout SDPA reads), k and v into `cache` [2, kv_heads, capacity, head_dim] at
  those positions, in place.
Both are bit-identical to llama_ops.rms_norm and llama_ops.apply_rope
(tests/nodes/engines/kernels/norm_rope/test_bf16.py). Rows that norm_rope.rows can take (a CPU with
AVX512-BF16, widths a multiple of 16) run on its vector code; the scalar loops here take every
other width. `warmup()` compiles both sets; kernels.dispatch decides whether they serve
(`norm_rope` "bf16").

Why: torch makes four passes over the rows for a norm (norm, scale, multiply, multiply) and three
for RoPE (multiply, concatenate, addcmul), then copies k and v into the cache; these kernels read
each value once and write it once, where it is needed, with the same roundings. docs/KERNELS.md
has the measured gain over compiled torch (`make bench-engine`).
"""

from __future__ import annotations

import numpy as np

from nodes.engines.kernels.jit import NUMBA as AVAILABLE
from nodes.engines.kernels.norm_rope import rows

if AVAILABLE:
    from nodes.engines.kernels.bf16_scalar import _bf16_bits, _norm_rows_bits, _rope_pair, _scale_of_squares
    from nodes.engines.kernels.jit import njit as _njit

    @_njit
    def _rms_norm_scalar(x, norm_w, eps, out):  # pragma: no cover - runs compiled
        _norm_rows_bits(x, norm_w, eps, out)

    @_njit
    def _rope_and_cache_scalar(qkv, cos, sin, start, num_heads, q_out, cache):  # pragma: no cover - runs compiled
        num_kv_heads, head_dim = cache.shape[1], cache.shape[3]
        half = head_dim // 2
        v_base = (num_heads + num_kv_heads) * head_dim
        rotated = np.empty((num_heads + num_kv_heads, head_dim), np.float32)
        for t in range(qkv.shape[0]):
            pos = start + t
            # Rotate into float32 scratch first: loads and stores of different types, which LLVM
            # knows cannot alias, so the loop vectorises (with uint16 in and out it does not).
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

    if rows.AVAILABLE:
        from nodes.engines.kernels.norm_rope.rows import normed_row, rope_token, sum_of_squares

        @_njit
        def _rms_norm_vectors(x, norm_w, eps, out):  # pragma: no cover - runs compiled
            for m in range(x.shape[0]):
                normed_row(x, m, _scale_of_squares(sum_of_squares(x, m), x.shape[1], eps), norm_w, out)

        @_njit
        def _rope_and_cache_vectors(qkv, cos, sin, start, num_heads, q_out, cache):  # pragma: no cover
            for t in range(qkv.shape[0]):
                rope_token(qkv, t, cos, sin, start + t, q_out, cache)

    def rms_norm(x: np.ndarray, norm_w: np.ndarray, eps: float, out: np.ndarray) -> None:
        if rows.can_take(x.shape[1]):
            _rms_norm_vectors(x, norm_w, eps, out)
        else:
            _rms_norm_scalar(x, norm_w, eps, out)

    def rope_and_cache(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, start: int, num_heads: int,
                       q_out: np.ndarray, cache: np.ndarray) -> None:
        assert q_out.shape[0] == num_heads, "q_out holds the span's q heads"
        if rows.can_take(cache.shape[3] // 2) and cache.shape[3] % 2 == 0:
            _rope_and_cache_vectors(qkv, cos, sin, start, num_heads, q_out, cache)
        else:
            _rope_and_cache_scalar(qkv, cos, sin, start, num_heads, q_out, cache)


def warmup() -> None:
    """Compile (or load from the disk cache) the kernels for the array types fast_path passes: the
    scalar loops, and the vector rows where this CPU has them (widths they take)."""
    for width, head_dim in ((8, 4), (16, 32)):
        x = np.zeros((2, width), np.uint16)
        rms_norm(x, x[0], 1e-5, x.copy())
        heads, kv_heads = 2, 1
        qkv = np.zeros((2, (heads + 2 * kv_heads) * head_dim), np.uint16)
        table = np.zeros((4, head_dim), np.uint16)
        cache = np.zeros((3, 2, kv_heads, 4, head_dim), np.uint16)[1]   # one layer of a cache, as in use
        rope_and_cache(qkv, table, table, 0, heads, np.zeros((heads, 2, head_dim), np.uint16), cache)
