"""The float32 outer products (nodes/engines/f32_dot.py): the packed layout, products against
float64 within float32 rounding, a row's result independent of the rows beside it, SmallLinear's
fallbacks to F.linear, and the runner taking them for float32 decode steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nodes.engines.kernels.linear import dot_f32 as f32_dot

pytestmark = pytest.mark.skipif(not f32_dot.AVAILABLE, reason="no AVX512-BF16 on this CPU (or no numba)")


def test_pack_puts_each_inputs_64_weights_side_by_side():
    w = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    packed = f32_dot.pack(w)
    assert packed.shape == (2, 3, 64)
    assert packed[0, 2, 5] == w[5, 2] and packed[1, 1, 5] == w[69, 1]
    assert not packed[1, :, 6:].any()   # outputs 70..127 are padding


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 32])
@pytest.mark.parametrize(("outputs", "inputs"), [(7, 5), (64, 64), (130, 576)])
def test_linear_is_the_product_to_float32_rounding(rows, outputs, inputs):
    g = torch.Generator().manual_seed(rows * 1000 + outputs)
    x, w = torch.randn(rows, inputs, generator=g), torch.randn(outputs, inputs, generator=g)
    out = np.zeros((rows, outputs), np.float32)
    f32_dot.linear(x.numpy(), f32_dot.pack(w.numpy()), out)
    exact = x.double() @ w.double().T
    bound = 1e-6 * inputs * (x.double().abs() @ w.double().abs().T)   # float32 sums of `inputs` terms
    assert bool(((torch.from_numpy(out).double() - exact).abs() <= bound).all())


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(32, 576, generator=g), torch.randn(130, 576, generator=g)
    packed = f32_dot.pack(w.numpy())
    alone = np.zeros((1, 130), np.float32)
    f32_dot.linear(x[5:6].numpy(), packed, alone)
    for rows in (2, 7, 13, 32):
        out = np.zeros((rows, 130), np.float32)
        f32_dot.linear(x[:rows].numpy() if rows > 5 else x[5 - rows + 1:6].numpy(), packed, out)
        assert np.array_equal(out[5 if rows > 5 else rows - 1], alone[0]), rows


def test_small_linear_serves_known_weights_of_small_steps_and_falls_back_otherwise():
    g = torch.Generator().manual_seed(4)
    w, other = torch.randn(96, 40, generator=g), torch.randn(96, 40, generator=g)
    small = f32_dot.SmallLinear([w])
    x = torch.randn(3, 40, generator=g)
    torch.testing.assert_close(small(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert torch.equal(small(x, other), F.linear(x, other))             # not packed: F.linear's own result
    big = torch.randn(f32_dot.MAX_ROWS + 1, 40, generator=g)
    assert torch.equal(small(big, w), F.linear(big, w))                 # a prefill-sized step
    assert small.num_bytes == 2 * 64 * 40 * 4                            # 96 outputs pad to two blocks


def test_small_linear_keeps_every_packed_matrix_64_byte_aligned():
    weights = [torch.randn(outputs, 48) for outputs in (3, 64, 65, 200)]   # odd sizes between them
    small = f32_dot.SmallLinear(weights)
    for weight in weights:
        packed = small._packed[id(weight)][1]
        assert packed.ctypes.data % 64 == 0   # a 64-byte load of weights never splits a cache line
        assert np.array_equal(packed, f32_dot.pack(weight.numpy()))


def test_the_float32_runner_takes_them_for_decode_steps(tiny_model):
    from nodes.engines.llama import LlamaRunner
    runner = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.float32)
    plain = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.float32, use_kernels=False)
    assert isinstance(runner._linear, f32_dot.SmallLinear)
    assert plain._linear is F.linear
