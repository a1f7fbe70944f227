"""soft_tiles (AMX's tile operations on AVX512-BF16 vectors) against tdpbf16ps's definition in
numpy: loads and stores with row strides, zeroing, and dots that accumulate pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines.kernels import soft_tiles

pytestmark = pytest.mark.skipif(not soft_tiles.AVAILABLE, reason="no AVX512-BF16 on this CPU (or no numba)")

if soft_tiles.AVAILABLE:
    import numba

    _zero0, _load_a, _load_b, _store0 = (soft_tiles.tile_zero(0), soft_tiles.tile_load(4),
                                         soft_tiles.tile_load(6), soft_tiles.tile_store(0))
    _load0, _dot = soft_tiles.tile_load(0), soft_tiles.tile_dot(0, 4, 6)

    @numba.njit
    def dots(a, b, out, start_from_out):
        """out = (out if start_from_out else 0) + a[0] . b[0] + a[1] . b[1] in tile terms."""
        soft_tiles.configure(soft_tiles.CONFIG)
        if start_from_out:
            _load0(out, 0, 0, np.int64(4 * out.shape[1]))
        else:
            _zero0()
        for t in range(a.shape[0]):
            _load_a(a[t], 0, 0, np.int64(2 * a.shape[2]))
            _load_b(b[t], 0, 0, np.int64(2 * b.shape[2]))
            _dot()
        _store0(out, 0, 0, np.int64(4 * out.shape[1]))
        soft_tiles.release()


def bf16_bits(values: torch.Tensor) -> np.ndarray:
    return values.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def as_f64(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).double().numpy()


def tdpbf16ps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """acc[m, n] = sum_k a[m, 2k] b[k, 2n] + a[m, 2k + 1] b[k, 2n + 1] (one 16 x 32 by 16 x 32 tile pair)."""
    a64, b64 = as_f64(a), as_f64(b)
    return np.einsum("mkp,knp->mn", a64[:, :32].reshape(16, 16, 2), b64[:, :32].reshape(16, 16, 2))


@pytest.mark.parametrize("start_from_out", [False, True])
def test_tile_dots_accumulate_pairs_as_tdpbf16ps(start_from_out):
    g = torch.Generator().manual_seed(3)
    # Rows wider than a tile (40 and 48 values): loads must follow the stride, not 64 bytes.
    a = bf16_bits(torch.randn(2, 16, 40, generator=g))
    b = bf16_bits(torch.randn(2, 16, 48, generator=g))
    out = np.zeros((16, 24), np.float32)
    out[:, :16] = np.arange(256, dtype=np.float32).reshape(16, 16) / 64
    out[:, 16:] = 7.0
    initial = out.copy()
    dots(a, b, out, start_from_out)
    expected = tdpbf16ps(a[0], b[0]) + tdpbf16ps(a[1], b[1]) + (initial[:, :16] if start_from_out else 0)
    np.testing.assert_allclose(out[:, :16], expected, rtol=1e-5, atol=1e-4)
    assert np.array_equal(out[:, 16:], initial[:, 16:])   # a store writes 64 bytes a row, no more
