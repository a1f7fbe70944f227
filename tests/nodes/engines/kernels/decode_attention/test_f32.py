"""The float32 decode attention kernel (nodes/engines/f32_attention.py) against a float64 reference:
GQA groups and plain heads, contexts of one key and many, rows in any slot order, the KV write at
each row's position of only the given layer; and a float32 engine's decode on it against the same
engine on torch's SDPA."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.engines.base import DecodeRequest, PrefillRequest
from nodes.engines.kernels.decode_attention import f32 as f32_attention
from tests.nodes.engines.engine_helpers import GREEDY, drain, make_engine

pytestmark = pytest.mark.skipif(not f32_attention.AVAILABLE, reason="numba is not installed")


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 4), (8, 2)])
@pytest.mark.parametrize("positions", [[0], [5, 40], [100, 7, 64, 17], [15, 16, 31, 47]])
@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
def test_attention_matches_a_float64_reference(num_heads, num_kv_heads, positions, prefetch):
    rng = np.random.default_rng(len(positions) * 10 + num_heads)
    rows, head_dim, capacity = len(positions), 64, 128
    cache = rng.normal(size=(2, rows, 2, num_kv_heads, capacity, head_dim)).astype(np.float32)
    other_layer = cache[0].copy()
    q = rng.normal(size=(rows, num_heads, head_dim)).astype(np.float32)
    k, v = (rng.normal(size=(rows, num_kv_heads, head_dim)).astype(np.float32) for _ in range(2))
    slots = np.arange(rows, dtype=np.int64)[::-1].copy()
    out = np.empty((rows, num_heads * head_dim), np.float32)
    f32_attention.decode_attention(q, k, v, np.array(positions, np.int64), slots, cache, 1, out, prefetch)
    group = num_heads // num_kv_heads
    for m, (pos, slot) in enumerate(zip(positions, slots, strict=True)):
        for h in range(num_heads):
            keys = cache[1, slot, 0, h // group, :pos + 1].astype(np.float64)
            values = cache[1, slot, 1, h // group, :pos + 1].astype(np.float64)
            np.testing.assert_array_equal(keys[pos], k[m, h // group])   # written at its position
            np.testing.assert_array_equal(values[pos], v[m, h // group])
            scores = keys @ q[m, h].astype(np.float64) / np.sqrt(head_dim)
            weights = np.exp(scores - scores.max())
            expected = weights @ values / weights.sum()
            np.testing.assert_allclose(out[m, h * head_dim:(h + 1) * head_dim], expected, atol=1e-5, rtol=1e-5)
    assert np.array_equal(cache[0], other_layer)   # only the given layer is written


def test_scores_spread_far_past_exps_range_still_match_the_reference():
    """Queries x40: a row's scores span hundreds, so most weights fall below float32's normal range
    and the kernel gives them 0 (bf16_attention.NEGLIGIBLE_GAP, which keeps FMAs off denormals)."""
    rng = np.random.default_rng(7)
    rows, num_heads, num_kv_heads, head_dim, capacity, pos = 2, 9, 3, 64, 512, 300
    cache = rng.normal(size=(1, rows, 2, num_kv_heads, capacity, head_dim)).astype(np.float32)
    q = (40 * rng.normal(size=(rows, num_heads, head_dim))).astype(np.float32)
    k, v = (rng.normal(size=(rows, num_kv_heads, head_dim)).astype(np.float32) for _ in range(2))
    out = np.empty((rows, num_heads * head_dim), np.float32)
    f32_attention.decode_attention(q, k, v, np.full(rows, pos, np.int64), np.arange(rows, dtype=np.int64), cache, 0,
                                   out, False)
    spread = 0.0
    for m in range(rows):
        for h in range(num_heads):
            keys, values = (cache[0, m, kv, h // 3, :pos + 1].astype(np.float64) for kv in (0, 1))
            scores = keys @ q[m, h].astype(np.float64) / np.sqrt(head_dim)
            spread = max(spread, scores.max() - scores.min())
            weights = np.exp(scores - scores.max())
            expected = weights @ values / weights.sum()
            np.testing.assert_allclose(out[m, h * head_dim:(h + 1) * head_dim], expected, atol=1e-5, rtol=1e-5)
    assert spread > 200   # the case this is about: exp of the gap would underflow


def test_a_rows_result_does_not_depend_on_the_rows_beside_it_nor_on_prefetching():
    """What continuous batching's equivalence rests on: a row attends alone exactly as in a batch."""
    rng = np.random.default_rng(3)
    num_heads, num_kv_heads, head_dim, capacity = 9, 3, 64, 96
    positions = np.array([95, 0, 16, 47, 63], np.int64)   # full, single-key and block-edge streams
    rows = len(positions)
    start = rng.normal(size=(1, rows, 2, num_kv_heads, capacity, head_dim)).astype(np.float32)
    q = rng.normal(size=(rows, num_heads, head_dim)).astype(np.float32)
    k, v = (rng.normal(size=(rows, num_kv_heads, head_dim)).astype(np.float32) for _ in range(2))
    slots = np.array([4, 0, 3, 1, 2], np.int64)
    together = {}
    for prefetch in (False, True):
        cache, out = start.copy(), np.empty((rows, num_heads * head_dim), np.float32)
        f32_attention.decode_attention(q, k, v, positions, slots, cache, 0, out, prefetch)
        together[prefetch] = (cache, out)
    np.testing.assert_array_equal(together[False][0], together[True][0])
    np.testing.assert_array_equal(together[False][1], together[True][1])
    for m in range(rows):
        cache, out = start.copy(), np.empty((1, num_heads * head_dim), np.float32)
        f32_attention.decode_attention(q[m:m + 1], k[m:m + 1], v[m:m + 1], positions[m:m + 1], slots[m:m + 1],
                                       cache, 0, out, True)
        np.testing.assert_array_equal(out[0], together[True][1][m])


def test_a_float32_engine_decodes_on_it_as_on_sdpa(tiny_model, monkeypatch):
    calls = []
    kernel = f32_attention.decode_attention
    monkeypatch.setattr(f32_attention, "decode_attention", lambda *a: calls.append(1) or kernel(*a))
    outputs = {}
    for attends in (True, False):
        engine = make_engine(tiny_model)
        assert engine.runner.f32_attends
        engine.runner.f32_attends = attends
        prompts = [tuple(tiny_model.tokenizer.encode(t)) for t in ("The quick brown fox", "Once upon a time")]
        results = engine.prefill([PrefillRequest(f"p{i}", p, GREEDY) for i, p in enumerate(prompts)])
        for i, (p, r) in enumerate(zip(prompts, results, strict=True)):
            assert engine.add_request(DecodeRequest(f"d{i}", p, GREEDY, kv=r.kv, first_token_id=r.first_token_id)).ok
        outputs[attends] = drain(engine)
    assert calls   # the kernel served the float32 decode steps
    assert outputs[True] == outputs[False]
