"""Causal prefill attention on AMX tiles against a float64 reference: GQA groups, spans that start
at 0 and after earlier tokens (chunked prefill), row counts around the 16-query blocks, and cache
slots past the span that hold NaN (never read into a result)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines import amx_tiles
from nodes.engines.bf16_gemv import bits

pytestmark = pytest.mark.skipif(not amx_tiles.AVAILABLE, reason="no AMX on this CPU (or numba missing)")

if amx_tiles.AVAILABLE:
    from nodes.engines import amx_attention


def bf16(values: np.ndarray) -> np.ndarray:
    return bits(torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16))


def f64(bits_: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits_.view(np.int16)).view(torch.bfloat16).double().numpy()


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int) -> np.ndarray:
    heads, rows, dim = q.shape
    group = heads // keys.shape[0]
    out = np.empty((rows, heads * dim))
    for h in range(heads):
        k, v = f64(keys[h // group]), f64(values[h // group])
        for i in range(rows):
            scores = k[:start + i + 1] @ f64(q[h, i]) / np.sqrt(dim)
            weights = np.exp(scores - scores.max())
            out[i, h * dim:(h + 1) * dim] = weights @ v[:start + i + 1] / weights.sum()
    return out


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 2), (2, 2)])
@pytest.mark.parametrize(("start", "rows"), [(0, 1), (0, 16), (0, 40), (7, 5), (33, 17), (16, 32)])
def test_prefill_attention_matches_a_float64_reference(num_heads, num_kv_heads, start, rows):
    rng = np.random.default_rng(start * 100 + rows + num_heads)
    capacity = start + rows + 20
    cache = rng.normal(size=(2, num_kv_heads, capacity, 64)) * 2
    cache[:, :, start + rows:] = np.nan   # past the span: must never reach a result
    cache_bits = bf16(cache)
    q = bf16(rng.normal(size=(num_heads, rows, 64)) * 2)
    out = np.empty((rows, num_heads * 64), np.uint16)
    amx_attention.prefill_attention(q, cache_bits[0], cache_bits[1], start, out)
    expected = reference(q, cache_bits[0], cache_bits[1], start)
    actual = f64(out)
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, atol=2e-2 * np.abs(expected).max() + 1e-3)


def test_only_head_dim_64_with_whole_groups_is_served():
    assert amx_attention.can_attend(9, 3, 64)
    assert not amx_attention.can_attend(9, 3, 128) and not amx_attention.can_attend(9, 4, 64)
