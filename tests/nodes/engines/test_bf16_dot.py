"""The vdpbf16ps GEMVs (nodes/engines/bf16_dot.py) against the widening GEMVs they replace
(bf16_kernels.py) and against float64 products: same bf16 results up to float32 summation order,
for every row count the blocks pad (1, 2, 4, 8k) and widths of odd and even vector counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines import bf16_dot, bf16_kernels

pytestmark = pytest.mark.skipif(not bf16_dot.AVAILABLE, reason="no AVX512-BF16 on this CPU (or no numba)")

ROWS = [1, 2, 3, 4, 5, 8, 9, 17, 24]
WIDTHS = [32, 96, 576]      # 1, 3 and 18 vectors of 32: the odd count takes the split sums' tail


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
    bf16_dot.linear(x, w, out)
    exact = bits((values(x) @ values(w).T).to(torch.bfloat16))
    assert_within_bf16_rounding(out, exact)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_every_kernel_agrees_with_the_widening_gemvs(rows, width):
    x, w, v, norm_w, residual = operands(rows, width)
    calls = {
        "linear": lambda k, out: k.linear(x, w, out),
        "norm_linear": lambda k, out: k.norm_linear(x, norm_w, 1e-5, w, out),
        "linear_add": lambda k, out: k.linear_add(x, w, residual, out),
        "norm_swiglu": lambda k, out: k.norm_swiglu(x, norm_w, 1e-5, w, v, out),
    }
    for name, call in calls.items():
        ours, theirs = (np.zeros((rows, w.shape[0]), np.uint16) for _ in range(2))
        call(bf16_dot, ours)
        call(bf16_kernels, theirs)
        assert_within_bf16_rounding(ours, theirs, name)


def test_an_odd_number_of_outputs_writes_every_one_once():
    """Outputs go in pairs (o, o + half); with an odd count the middle one has no partner."""
    x, w, _, _, residual = operands(3, 64, outputs=7)
    out = np.zeros((3, 7), np.uint16)
    bf16_dot.linear_add(x, w, residual, out)
    expected = bits((values(x) @ values(w).T + values(residual)).to(torch.bfloat16))
    assert_within_bf16_rounding(out, expected)


def test_padded_rows_are_1_2_4_or_a_multiple_of_8():
    assert [bf16_dot.padded_rows(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 24]


def test_can_run_needs_whole_vectors_of_pairs():
    assert bf16_dot.can_run(576) and bf16_dot.can_run(32)
    assert not bf16_dot.can_run(48) and not bf16_dot.can_run(0)
