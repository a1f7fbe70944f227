"""The AMX linear kernels against their contract in float64 (same norms, same roundings,
float32 sums in another order), and the vectorised silu against libm's."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.engines.kernels import amx_tiles, bf16_scalar
from tests.nodes.engines.engine_helpers import bf16_bits, widened
from tests.nodes.engines.kernels.linear import bf16_reference

pytestmark = pytest.mark.skipif(not amx_tiles.AVAILABLE, reason="no AMX on this CPU (or numba missing)")

if amx_tiles.AVAILABLE:
    import numba

    from nodes.engines.kernels.linear import amx as amx_linear



def assert_bf16_close(actual: np.ndarray, expected: np.ndarray) -> None:
    a, e = widened(actual), widened(expected)
    np.testing.assert_allclose(a, e, atol=0.02 * np.abs(e).max(), rtol=0)
    assert np.mean(a == e) > 0.9   # most values round the same way


def scratch(rows: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    padded = 16 if rows <= 16 else 32
    return np.zeros((padded, k), np.uint16), np.zeros((padded, n), np.float32)


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_three_kernels_match_the_float64_reference(rows):
    rng = np.random.default_rng(rows)
    k, n = 64, 96
    x, norm_w = bf16_bits(rng.normal(size=(rows, k))), bf16_bits(rng.normal(1.0, 0.1, size=k))
    w, w2 = bf16_bits(rng.normal(size=(n, k)) * 0.1), bf16_bits(rng.normal(size=(n, k)) * 0.1)
    x_pad, acc = scratch(rows, k, n)

    ours, theirs = np.zeros((rows, n), np.uint16), np.zeros((rows, n), np.uint16)
    amx_linear.norm_linear(x, norm_w, 1e-5, amx_tiles.pack(w), x_pad, acc, ours)
    bf16_reference.norm_linear(x, norm_w, 1e-5, w, theirs)
    assert_bf16_close(ours, theirs)

    wide, back = bf16_bits(rng.normal(size=(rows, n))), bf16_bits(rng.normal(size=(k, n)) * 0.1)
    pad_n, acc_k = scratch(rows, n, k)
    ours, theirs = x.copy(), x.copy()   # residual + wide @ back.T, in place
    amx_linear.linear_add(wide, amx_tiles.pack(back), ours, pad_n, acc_k, ours)
    bf16_reference.linear_add(wide, back, theirs, theirs)
    assert_bf16_close(ours, theirs)

    ours, theirs = np.zeros((rows, n), np.uint16), np.zeros((rows, n), np.uint16)
    amx_linear.norm_swiglu(x, norm_w, 1e-5, amx_tiles.pack(w), amx_tiles.pack(w2), x_pad, acc, acc.copy(), ours)
    bf16_reference.norm_swiglu(x, norm_w, 1e-5, w, w2, theirs)
    assert_bf16_close(ours, theirs)


def test_the_vectorised_silu_is_within_a_few_ulp_of_libms():
    @numba.njit
    def silu_all(values, out):
        for i in range(values.shape[0]):
            out[i] = bf16_scalar._silu_vectorised(values[i])

    values = np.concatenate([-np.geomspace(1e-6, 100, 2000), [0.0], np.geomspace(1e-6, 100, 2000)]).astype(np.float32)
    out = np.empty_like(values)
    silu_all(values, out)
    exact = values.astype(np.float64) / (1 + np.exp(-values.astype(np.float64)))
    np.testing.assert_allclose(out, exact, rtol=2e-6, atol=1e-30)
