"""The numba decode attention kernel against a float64 reference: its exp, its softmax attention for
GQA groups of 3 of 64 (the 16-key block path) and other shapes (key by key), contexts below, at and
across multiples of 16 keys, several rows (units interleaved) in any slot order, on both block kernels
(float32 FMAs, and vdpbf16ps pairs where the CPU has AVX512-BF16); its prefetch requests change no
bit of the output, and the start-up choice whether to make them (f32_attention's too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines.kernels import bf16_scalar
from nodes.engines.kernels.decode_attention import bf16 as bf16_attention
from nodes.engines.kernels.decode_attention import f32 as f32_attention
from nodes.engines.kernels.fast_path import bits
from nodes.engines.kernels.jit import NUMBA

pytestmark = pytest.mark.skipif(not NUMBA, reason="numba is not installed")


def test_the_vectorised_exp_is_within_a_few_ulp_of_exp():
    x = np.concatenate([-np.geomspace(1e-7, 87, 20000), [0.0, -0.5, -1.0]]).astype(np.float32)
    ours = np.array([bf16_scalar._exp_nonpositive(np.float32(v)) for v in x], np.float64)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(ours - exact) / exact) < 5e-7
    assert bf16_scalar._exp_nonpositive(np.float32(-200.0)) < 1e-37   # flushed, not garbage


# Every mode runs on every CPU that has its instructions, whichever one the runner picks here (PAIR_VALUES).
_NEEDS_PAIRS = pytest.mark.skipif(not bf16_attention.PAIRS, reason="vdpbf16ps blocks need AVX512-BF16")
MODES = [(False, False), pytest.param(True, False, marks=_NEEDS_PAIRS), pytest.param(True, True, marks=_NEEDS_PAIRS)]
MODE_IDS = ["widening", "pair-keys", "pairs"]


def bf16(values: np.ndarray) -> np.ndarray:
    return bits(torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16))


def f32(bits_: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits_.view(np.int16)).view(torch.bfloat16).float().numpy().astype(np.float64)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (8, 2), (4, 4)])
@pytest.mark.parametrize("positions", [[0], [3, 40], [100, 7, 64], [15, 16, 31, 47]])
@pytest.mark.parametrize(("pairs", "pair_values"), MODES, ids=MODE_IDS)
def test_attention_matches_a_float64_reference(num_heads, num_kv_heads, positions, pairs, pair_values):
    rng = np.random.default_rng(len(positions) + num_heads)
    head_dim, capacity, rows = 64, 128, len(positions)
    cache = bf16(rng.normal(size=(2, rows, 2, num_kv_heads, capacity, head_dim)))
    other_layer = cache[0].copy()
    qkv = bf16(rng.normal(size=(rows, (num_heads + 2 * num_kv_heads) * head_dim)))
    cos, sin = bf16(np.ones((capacity, head_dim))), bf16(np.zeros((capacity, head_dim)))   # RoPE = identity
    out = np.empty((rows, num_heads * head_dim), np.uint16)
    slots = np.arange(rows, dtype=np.int64)[::-1].copy()
    bf16_attention.decode_attention(qkv, cos, sin, np.array(positions, np.int64), slots, cache, 1, num_heads, out, pairs,
                                    pair_values, False)
    group = num_heads // num_kv_heads
    for m, (pos, slot) in enumerate(zip(positions, slots, strict=True)):
        q = f32(qkv[m]).reshape(-1, head_dim)
        for h in range(num_heads):
            g = h // group
            keys, values = f32(cache[1, slot, 0, g, :pos + 1]), f32(cache[1, slot, 1, g, :pos + 1])
            np.testing.assert_array_equal(keys[pos], q[num_heads + g])           # k written at its position
            np.testing.assert_array_equal(values[pos], q[num_heads + num_kv_heads + g])
            scores = keys @ q[h] / np.sqrt(head_dim)
            weights = np.exp(scores - scores.max())
            expected = weights @ values / weights.sum()
            actual = f32(out[m, h * head_dim:(h + 1) * head_dim])
            np.testing.assert_allclose(actual, expected, atol=2e-2 * np.abs(expected).max() + 1e-3)
    assert np.array_equal(cache[0], other_layer)   # only the given layer is written


@pytest.mark.parametrize(("pairs", "pair_values"), MODES, ids=MODE_IDS)
def test_scores_spread_far_past_exps_range_still_match_the_reference(pairs, pair_values):
    """Queries x40: most weights fall below float32's normal range, and the kernel gives them 0
    (NEGLIGIBLE_GAP: FMAs on denormal products had made it up to 6x slower)."""
    rng = np.random.default_rng(8)
    num_heads, num_kv_heads, head_dim, capacity, pos = 9, 3, 64, 512, 300
    cache = bf16(rng.normal(size=(1, 1, 2, num_kv_heads, capacity, head_dim)))
    qkv = bf16(np.concatenate([40 * rng.normal(size=num_heads * head_dim),
                               rng.normal(size=2 * num_kv_heads * head_dim)])[None])
    cos, sin = bf16(np.ones((capacity, head_dim))), bf16(np.zeros((capacity, head_dim)))   # RoPE = identity
    out = np.empty((1, num_heads * head_dim), np.uint16)
    bf16_attention.decode_attention(qkv, cos, sin, np.array([pos], np.int64), np.zeros(1, np.int64), cache, 0,
                                    num_heads, out, pairs, pair_values, False)
    q = f32(qkv[0]).reshape(-1, head_dim)
    for h in range(num_heads):
        keys, values = f32(cache[0, 0, 0, h // 3, :pos + 1]), f32(cache[0, 0, 1, h // 3, :pos + 1])
        scores = keys @ q[h] / np.sqrt(head_dim)
        assert scores.max() - scores.min() > 200   # exp of the gap would underflow
        weights = np.exp(scores - scores.max())
        expected = weights @ values / weights.sum()
        actual = f32(out[0, h * head_dim:(h + 1) * head_dim])
        np.testing.assert_allclose(actual, expected, atol=2e-2 * np.abs(expected).max() + 1e-3)


@pytest.mark.parametrize(("pairs", "pair_values"), MODES, ids=MODE_IDS)
def test_prefetch_requests_change_no_bit_of_the_output_or_the_cache(pairs, pair_values):
    rng = np.random.default_rng(7)
    num_heads, num_kv_heads, head_dim, capacity = 9, 3, 64, 96
    positions = np.array([95, 0, 16, 47, 63], np.int64)   # full, single-key and block-edge streams
    rows = len(positions)
    qkv = bf16(rng.normal(size=(rows, (num_heads + 2 * num_kv_heads) * head_dim)))
    cos, sin = bf16(rng.normal(size=(capacity, head_dim))), bf16(rng.normal(size=(capacity, head_dim)))
    start = bf16(rng.normal(size=(2, rows, 2, num_kv_heads, capacity, head_dim)))
    slots = np.array([4, 0, 3, 1, 2], np.int64)
    results = []
    for prefetch in (False, True):
        cache, out = start.copy(), np.empty((rows, num_heads * head_dim), np.uint16)
        bf16_attention.decode_attention(qkv, cos, sin, positions, slots, cache, 0, num_heads, out, pairs, pair_values,
                                        prefetch)
        results.append((cache, out))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("kernel", [bf16_attention, f32_attention], ids=["bf16", "float32"])
def test_whether_to_prefetch_is_timed_once_a_process_unless_forced(monkeypatch, kernel):
    kernel.prefetch_pays.cache_clear()
    try:
        for forced, expected in (("1", True), ("0", False)):
            monkeypatch.setenv("PDBUS_ATTENTION_PREFETCH", forced)
            kernel.prefetch_pays.cache_clear()
            assert kernel.prefetch_pays() is expected
        monkeypatch.delenv("PDBUS_ATTENTION_PREFETCH")
        kernel.prefetch_pays.cache_clear()
        first = kernel.prefetch_pays(num_bytes=4 << 20, rounds=1)   # timed: either answer is right
        assert isinstance(first, bool)
        assert kernel.prefetch_pays(num_bytes=4 << 20, rounds=1) is first   # asked again: not re-timed
        assert kernel.prefetch_pays.cache_info().hits == 1
    finally:
        kernel.prefetch_pays.cache_clear()
