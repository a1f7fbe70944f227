"""AMX tile matmul against numpy: the packed tile layout, one and two row tiles, padded rows."""

from __future__ import annotations

import numpy as np
import pytest

from nodes.engines.kernels import amx_tiles
from tests.nodes.engines.engine_helpers import bf16_bits, widened

needs_amx = pytest.mark.skipif(not amx_tiles.AVAILABLE, reason="no AMX on this CPU (or numba missing)")



def test_packing_puts_k_pairs_of_16_outputs_in_each_tile_row():
    w = np.arange(64 * 96, dtype=np.uint16).reshape(64, 96)
    tiles = amx_tiles.pack(w)
    assert tiles.shape == (4, 3, 16, 32)
    for n, k, r, c in [(0, 0, 0, 0), (1, 2, 5, 7), (3, 1, 15, 31), (2, 0, 9, 16)]:
        assert tiles[n, k, r, c] == w[16 * n + c // 2, 32 * k + 2 * r + c % 2]


def test_only_shapes_in_whole_tile_pairs_pack():
    assert amx_tiles.can_pack((960, 576)) and amx_tiles.can_pack((49152, 576))
    assert not amx_tiles.can_pack((48, 576)) and not amx_tiles.can_pack((64, 40))
    with pytest.raises(AssertionError, match="multiples of 32"):
        amx_tiles.pack(np.zeros((48, 64), np.uint16))


@needs_amx
@pytest.mark.parametrize("rows", [16, 32])
def test_matmul_matches_numpy_in_float32(rows):
    rng = np.random.default_rng(rows)
    x, w = bf16_bits(rng.normal(size=(rows, 96))), bf16_bits(rng.normal(size=(128, 96)))
    out = np.full((rows, 128), np.nan, np.float32)
    amx_tiles.matmul(x, amx_tiles.pack(w), out)
    np.testing.assert_allclose(out, widened(x) @ widened(w).T, rtol=1e-5, atol=1e-4)


@needs_amx
def test_each_output_row_depends_on_its_own_row_only():
    rng = np.random.default_rng(0)
    w = amx_tiles.pack(bf16_bits(rng.normal(size=(64, 64))))
    x = bf16_bits(rng.normal(size=(16, 64)))
    noisy = x.copy()
    noisy[3:] = bf16_bits(np.full((13, 64), np.nan))   # padding rows may hold anything
    clean_out, noisy_out = np.zeros((16, 64), np.float32), np.zeros((16, 64), np.float32)
    amx_tiles.matmul(x, w, clean_out)
    amx_tiles.matmul(noisy, w, noisy_out)
    np.testing.assert_array_equal(clean_out[:3], noisy_out[:3])


@pytest.mark.parametrize("shape", [(1,), (16, 64), (3, 5, 7)])
def test_aligned_zeros_start_on_a_page_and_hold_zeros(shape):
    for dtype in (np.uint16, np.float32):
        array = amx_tiles.aligned_zeros(shape, dtype)
        assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous
        assert array.ctypes.data % amx_tiles.ALIGNMENT == 0 and not array.any()


def test_the_attention_workspace_is_aligned_for_tiles():
    from nodes.engines.kernels.prefill_attention import tiled as amx_attention
    workspace = amx_attention.Workspace(100)
    for array in (workspace.packed_keys, workspace.packed_values, workspace.scores, workspace.queries, workspace.acc):
        assert array.ctypes.data % amx_tiles.ALIGNMENT == 0
