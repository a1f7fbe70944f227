"""The vdpbf16ps outer products (kernels/linear/dot_bf16.py) against their contract in float64
(bf16_reference.py) and against float64 products: same bf16 results up to float32 summation order,
for row counts of every group size and several groups, output counts short of and past a block of
64, and a row's result the same bits whatever rows share its step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines.kernels.linear import dot_bf16 as bf16_dot
from tests.nodes.engines.kernels.linear import bf16_reference

pytestmark = pytest.mark.skipif(not bf16_dot.AVAILABLE, reason="no AVX512-BF16 on this CPU (or no numba)")

ROWS = [1, 2, 3, 4, 5, 6, 7, 13, 32]   # groups of 1-6 rows, and 2, 3 and 6 groups
WIDTHS = [32, 96, 576]                  # 1, 3 and 18 vectors of 32 inputs


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def values(b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(b.view(np.int16)).view(torch.bfloat16).double()


def operands(rows: int, width: int, outputs: int = 70, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 97 * rows + width)
    x = bits(torch.randn(rows, width, generator=g).to(torch.bfloat16))
    w = bits((torch.randn(outputs, width, generator=g) * 0.05).to(torch.bfloat16))
    v = bits((torch.randn(outputs, width, generator=g) * 0.05).to(torch.bfloat16))
    norm_w = bits((1 + 0.1 * torch.randn(width, generator=g)).to(torch.bfloat16))
    residual = bits(torch.randn(rows, outputs, generator=g).to(torch.bfloat16))
    return x, w, v, norm_w, residual


def assert_within_bf16_rounding(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Float32 sums in another order round to the same bf16 or a neighbour: at most one step."""
    a, e = values(actual), values(expected)
    step = e.abs().clamp_min(2.0 ** -100) * 2.0 ** -7
    assert bool(((a - e).abs() <= step).all()), (what, float(((a - e).abs() / step).max()))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_linear_is_the_bf16_rounded_product(rows, width):
    x, w, *_ = operands(rows, width)
    out = np.zeros((rows, w.shape[0]), np.uint16)
    bf16_dot.linear(x, bf16_dot.pack(w), out)
    exact = bits((values(x) @ values(w).T).to(torch.bfloat16))
    assert_within_bf16_rounding(out, exact)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_every_kernel_agrees_with_the_float64_reference(rows, width):
    x, w, v, norm_w, residual = operands(rows, width)
    calls = {
        "linear": lambda k, w, v, out: k.linear(x, w, out),
        "norm_linear": lambda k, w, v, out: k.norm_linear(x, norm_w, 1e-5, w, out),
        "linear_add": lambda k, w, v, out: k.linear_add(x, w, residual, out),
        "norm_swiglu": lambda k, w, v, out: k.norm_swiglu(x, norm_w, 1e-5, w, v, out),
    }
    for name, call in calls.items():
        ours, theirs = (np.zeros((rows, w.shape[0]), np.uint16) for _ in range(2))
        call(bf16_dot, bf16_dot.pack(w), bf16_dot.pack(v), ours)
        call(bf16_reference, w, v, theirs)
        assert_within_bf16_rounding(ours, theirs, name)


@pytest.mark.parametrize("outputs", [7, 64, 130])
def test_outputs_short_of_or_past_a_block_are_each_written_once(outputs):
    """Packing pads the outputs to whole blocks of 64; only the matrix's own reach `out`."""
    x, w, _, _, residual = operands(3, 64, outputs=outputs)
    out = np.zeros((3, outputs), np.uint16)
    bf16_dot.linear_add(x, bf16_dot.pack(w), residual, out)
    expected = bits((values(x) @ values(w).T + values(residual)).to(torch.bfloat16))
    assert_within_bf16_rounding(out, expected)


def test_pack_puts_each_blocks_weight_pairs_side_by_side():
    w = np.arange(70 * 4, dtype=np.uint16).reshape(70, 4)
    packed = bf16_dot.pack(w)
    assert packed.shape == (2, 2, 64, 2)
    assert packed[0, 1, 5].tolist() == w[5, 2:4].tolist()
    assert packed[1, 0, 5].tolist() == w[69, 0:2].tolist()
    assert not packed[1, :, 6:].any()   # outputs 70..127 are padding


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """Same summation order in every group size: a decode row's logits stay bit-identical as
    requests join and leave the batch."""
    x, w, *_ = operands(32, 576, outputs=130)
    packed = bf16_dot.pack(w)
    alone = np.zeros((1, 130), np.uint16)
    bf16_dot.linear(x[5:6], packed, alone)
    for rows in (2, 7, 13, 32):
        out = np.zeros((rows, 130), np.uint16)
        bf16_dot.linear(x[5 - min(5, rows - 1):][:rows], packed, out)
        assert np.array_equal(out[min(5, rows - 1)], alone[0]), rows


def test_can_run_needs_whole_vectors_of_pairs():
    assert bf16_dot.can_run(576) and bf16_dot.can_run(32)
    assert not bf16_dot.can_run(48) and not bf16_dot.can_run(0)
