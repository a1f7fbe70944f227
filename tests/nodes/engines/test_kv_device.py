"""The device KV codec (nodes/engines/kv_device.py) against bus/kv's numpy reference, bit for bit.

The same torch ops run on a GPU; tests/nodes/engines/test_kv_device_cuda.py repeats the comparison
there (marked gpu). Here: hypothesis over row values (ties, constant rows, tiny and huge ranges,
non-finite values), every source dtype, and the decoded values into float32 and bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.kv.layout import ChunkSpec, KVInfo
from bus.kv.quant import NumpyQuantizer
from nodes.engines import kv_device
from tests.nodes.engines.engine_helpers import DTYPES, reference_encode


def device_encode(rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray, bool]:
    codes = torch.empty(rows.shape, dtype=torch.uint8)
    lo = torch.empty(rows.shape[0], dtype=torch.float16)
    hi = torch.empty_like(lo)
    fits = kv_device.encode_int8_rows(rows, codes, lo, hi)
    return codes.numpy().reshape(-1), torch.cat([lo, hi]).view(torch.uint8).numpy(), bool(fits)


finite = st.floats(min_value=-300.0, max_value=300.0, allow_nan=False, width=32)
special = st.sampled_from([0.0, -0.0, 1e-8, -1e-8, 0.5, 127.5, 1.0 / 3.0, 65000.0, -65000.0])


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(sorted(DTYPES)), st.integers(1, 6), st.sampled_from([1, 4, 64]))
def test_int8_encode_is_the_reference_bit_for_bit(data, dtype, pairs, head_dim):
    values = data.draw(st.lists(st.one_of(finite, special), min_size=2 * pairs * head_dim, max_size=2 * pairs * head_dim))
    rows = torch.tensor(values, dtype=torch.float32).view(2 * pairs, head_dim).to(DTYPES[dtype])
    codes, params, fits = device_encode(rows)
    ref_codes, ref_params, scale_dtype = reference_encode(rows)
    assert fits == (scale_dtype == "f16")
    if fits:
        np.testing.assert_array_equal(codes, ref_codes)
        np.testing.assert_array_equal(params, ref_params)


def test_a_range_beyond_float16_or_a_non_finite_value_does_not_fit():
    rows = torch.randn(4, 8)
    rows[1, 3] = 70000.0
    assert device_encode(rows)[2] is False
    rows[1, 3] = float("nan")
    assert device_encode(rows)[2] is False
    rows[1, 3] = float("inf")
    assert device_encode(rows)[2] is False


@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
def test_int8_decode_is_the_reference_bit_for_bit(source, out_dtype):
    rows = (torch.randn(64, 128) * torch.logspace(-3, 2, 64)[:, None]).to(DTYPES[source])
    codes, params, _ = reference_encode(rows)
    info = KVInfo((1, 2, 1, 32, 128), source)
    spec = ChunkSpec(0, 0, 2, 0, 32)
    ref = np.empty(info.shape, np.float32 if out_dtype == "float32" else np.uint16)
    NumpyQuantizer().decode([codes, params], info, spec, "int8", "f16", ref)
    out = torch.empty(info.shape, dtype=DTYPES[out_dtype])
    p = torch.from_numpy(params.copy()).view(torch.float16)
    kv_device.decode_int8_rows(torch.from_numpy(codes.copy()).view(64, 128), p[:64], p[64:], out)
    got = out.numpy() if out_dtype == "float32" else out.view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(got, ref)
