"""The softmax and output rows of prefill attention in LLVM vectors (nodes/engines/attention_rows.py)
against float64 numpy: weights within bf16 rounding, the sum to float32 precision, nothing computed
from lanes past the visible keys (NaN, infinities, denormals there), weights written over their own
scores, and the polynomial behind exp."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines.kernels import llvm_rows as attention_rows

pytestmark = pytest.mark.skipif(not attention_rows.AVAILABLE, reason="no AVX512-BF16 on this CPU (or numba missing)")

if attention_rows.AVAILABLE:
    import numba

    @numba.njit
    def softmax_rows(scores, weights, visible, width, scale):
        totals = np.empty(scores.shape[0], np.float32)
        for i in range(scores.shape[0]):
            totals[i] = attention_rows.softmax_row(scores, weights, i, visible[i], width, scale)
        return totals

    @numba.njit
    def causal_rows(scores, weights, first, last, width, scale):
        totals = np.empty(scores.shape[0], np.float32)
        for i0 in range(0, scores.shape[0], attention_rows.CAUSAL_ROWS):
            attention_rows.causal_softmax_rows(scores, weights, i0, first, last, width, scale, totals)
        return totals

    @numba.njit
    def scale_rows(acc, factors, out, column):
        for i in range(acc.shape[0]):
            attention_rows.scaled_row(acc, i, factors[i], out, i, column)


def as_f64(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).double().numpy()


def expected(scores: np.ndarray, visible: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    weights = np.zeros(scores.shape)
    for i, n in enumerate(visible):
        row = scores[i, :n].astype(np.float64)
        weights[i, :n] = np.exp(scale * (row - row.max()))
    return weights, weights.sum(axis=1)


@pytest.mark.parametrize("width", [32, 96, 1024])
def test_softmax_rows_match_float64_and_ignore_lanes_past_the_visible_keys(width):
    rng = np.random.default_rng(width)
    rows = 7
    scores = (rng.normal(size=(rows, width)) * 40).astype(np.float32)
    visible = np.array([1, 2, 15, 16, 17, width - 1, width], np.int64)[:rows]
    for i, n in enumerate(visible):   # what may lie past a row's visible keys
        scores[i, n:] = np.array([np.nan, np.inf, -np.inf, 1e-40, 3e38], np.float32)[np.arange(width - n) % 5]
    weights = np.full((rows, width), 0xFFFF, np.uint16)
    totals = softmax_rows(scores, weights, visible, width, np.float32(0.125))
    want, want_totals = expected(scores, visible, 0.125)
    got = as_f64(weights)
    assert np.isfinite(got).all() and np.isfinite(totals).all()
    np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-37)        # bf16: half a step
    np.testing.assert_allclose(totals, want_totals, rtol=1e-5)
    for i, n in enumerate(visible):
        assert not got[i, n:].any()


@pytest.mark.parametrize(("first", "last", "width"), [(1, 16, 32), (17, 29, 32), (40, 55, 64), (500, 515, 544)])
def test_causal_rows_at_once_match_one_row_at_a_time(first, last, width):
    """Rows i0..i0 + 3 seeing min(first + i, last) keys, lanes past them as in a causal block
    (stale values, NaN): the same weights as softmax_row, the sums to float32 precision."""
    rng = np.random.default_rng(first)
    scores = (rng.normal(size=(16, width + 16)) * 30).astype(np.float32)
    visible = np.minimum(first + np.arange(16), last)
    for i, n in enumerate(visible):
        scores[i, n:] = np.nan
    one_weights, all_weights = (np.full((16, width), 0xFFFF, np.uint16) for _ in range(2))
    one_totals = softmax_rows(scores.copy(), one_weights, visible, width, np.float32(0.125))
    all_totals = causal_rows(scores.copy(), all_weights, first, last, width, np.float32(0.125))
    assert np.array_equal(all_weights, one_weights)
    np.testing.assert_allclose(all_totals, one_totals, rtol=1e-6)


def test_weights_may_be_written_over_their_own_scores():
    rng = np.random.default_rng(1)
    scores = (rng.normal(size=(3, 64 + 16)) * 8).astype(np.float32)
    visible = np.array([64, 40, 9], np.int64)
    want, want_totals = expected(scores.copy(), visible, 0.5)
    totals = softmax_rows(scores, scores.view(np.uint16), visible, 64, np.float32(0.5))
    np.testing.assert_allclose(as_f64(scores.view(np.uint16)[:, :64]), want[:, :64], rtol=2 ** -8, atol=1e-37)
    np.testing.assert_allclose(totals, want_totals, rtol=1e-5)


def test_very_negative_scores_give_tiny_weights_not_denormals_or_nan():
    scores = np.zeros((1, 32), np.float32)
    scores[0, 1:] = -1e4
    weights = np.zeros((1, 32), np.uint16)
    totals = softmax_rows(scores, weights, np.array([32]), 32, np.float32(1.0))
    got = as_f64(weights)
    assert got[0, 0] == 1.0 and totals[0] == pytest.approx(1.0)
    assert (got[0, 1:] >= 0).all() and (got[0, 1:] < 1e-37).all()


def test_scaled_rows_round_to_bf16_like_torch():
    rng = np.random.default_rng(2)
    acc = (rng.normal(size=(4, 64)) * 100).astype(np.float32)
    factors = rng.uniform(0.01, 2, size=4).astype(np.float32)
    out = np.zeros((4, 3 * 64), np.uint16)
    scale_rows(acc, factors, out, 64)
    want = torch.from_numpy(acc * factors[:, None]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(out[:, 64:128], want)
    assert not out[:, :64].any() and not out[:, 128:].any()


def test_the_exp2_polynomial_is_accurate_to_far_below_a_bf16_step():
    f = np.linspace(0, 1, 10_001)[:-1]
    p = np.polynomial.polynomial.polyval(f, attention_rows.exp2_coefficients())
    assert np.max(np.abs(p / 2 ** f - 1)) < 1e-5
