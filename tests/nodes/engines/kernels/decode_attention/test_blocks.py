"""The 16-key block kernels against numpy: scores and their lane maxima, weighted value sums, for
several group sizes and head widths, at a block that does not start at key 0, on bf16 rows and on
the float32 rows of f32_attention's cache."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.engines.kernels.jit import NUMBA
from tests.nodes.engines.engine_helpers import bf16_bits, widened

pytestmark = pytest.mark.skipif(not NUMBA, reason="numba is not installed")

if NUMBA:
    import numba

    from nodes.engines.kernels.decode_attention import blocks as bf16_blocks



def compiled(group: int, head_dim: int, f32: bool = False):
    qk = bf16_blocks.make_qk_block(group, head_dim, f32=f32)
    pv = bf16_blocks.make_pv_block(group, head_dim, f32=f32)

    @numba.njit
    def scores_of(q, first, keys, j0, scale, scores, tops):
        qk(q, first, keys, j0, scale, scores, tops)

    @numba.njit
    def weigh(weights, values, j0, acc):
        pv(weights, values, j0, acc)

    return scores_of, weigh


def key_rows(rng, num_rows: int, head_dim: int, f32: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows as the block reads them (bf16 bits, or float32 for f32_attention's cache), and as float64."""
    if f32:
        rows = rng.normal(size=(num_rows, head_dim)).astype(np.float32)
        return rows, rows.astype(np.float64)
    rows = bf16_bits(rng.normal(size=(num_rows, head_dim)))
    return rows, widened(rows)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "float32"])
@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (1, 16), (4, 128)])
def test_a_block_scores_16_keys_for_every_head_and_keeps_their_lane_maxima(group, head_dim, f32):
    rng = np.random.default_rng(group)
    scores_of, _ = compiled(group, head_dim, f32)
    q = rng.normal(size=(group + 2, head_dim)).astype(np.float32)
    keys, wide_keys = key_rows(rng, 40, head_dim, f32)
    scores = np.zeros((group, 40), np.float32)
    tops = np.full((group, 16), 5.0, np.float32)
    tops[:, ::2] = -1e30
    scores_of(q, 1, keys, 16, np.float32(0.125), scores, tops)
    expected = q[1:1 + group].astype(np.float64) @ wide_keys[16:32].T * 0.125
    np.testing.assert_allclose(scores[:, 16:32], expected, rtol=1e-5, atol=1e-5)
    assert not scores[:, :16].any() and not scores[:, 32:].any()   # only its own 16 keys
    np.testing.assert_allclose(tops[:, ::2], expected[:, ::2], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tops[:, 1::2], np.maximum(5.0, scores[:, 17:32:2]))


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "float32"])
@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (2, 32)])
def test_a_block_adds_16_weighted_value_rows_to_the_accumulators(group, head_dim, f32):
    rng = np.random.default_rng(head_dim)
    _, weigh = compiled(group, head_dim, f32)
    weights = rng.random(size=(group, 48)).astype(np.float32)
    values, wide_values = key_rows(rng, 48, head_dim, f32)
    acc = rng.normal(size=(group, head_dim)).astype(np.float32)
    expected = acc.astype(np.float64) + weights[:, 32:48].astype(np.float64) @ wide_values[32:48]
    weigh(weights, values, 32, acc)
    np.testing.assert_allclose(acc, expected, rtol=1e-5, atol=1e-5)
