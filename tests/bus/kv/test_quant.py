"""Quantization modes of the numpy quantizer: exactness, error bounds, failure paths."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv.kv_errors import KVFrameError, KVValueError
from bus.kv.layout import bf16_bits_to_f32, f32_to_bf16_bits, numpy_kv_info, plan_chunks
from bus.kv.quant import NumpyQuantizer, max_payload_sizes, payload_sizes
from tests.bus.kv.conftest import synthetic_kv


def round_trip(kv, mode, dst_dtype=None, chunk_bytes=1500, kv_dtype=None):
    quantizer = NumpyQuantizer()
    info = numpy_kv_info(kv, kv_dtype)
    specs = plan_chunks(info, chunk_bytes)
    outs = [np.empty(n, np.uint8) for n in max_payload_sizes(mode, max(s.num_rows for s in specs), info)]
    dst = np.zeros(kv.shape, dst_dtype or kv.dtype)
    wire = 0
    for spec in specs:
        payload = quantizer.encode(kv, info, spec, mode, outs)
        frames = [np.frombuffer(memoryview(f).cast("B"), np.uint8).copy() for f in payload.frames]
        assert [f.size for f in frames] == payload_sizes(mode, spec, info, payload.scale_dtype)
        wire += sum(f.size for f in frames)
        quantizer.decode(frames, info, spec, mode, payload.scale_dtype, dst)
    return dst, wire


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_raw_is_bit_exact(dtype):
    kv = synthetic_kv(dtype=dtype)
    dst, wire = round_trip(kv, "raw")
    assert dst.tobytes() == kv.tobytes() and wire == kv.nbytes


def test_raw_bf16_is_bit_exact_and_bf16_of_bf16_too():
    bits = f32_to_bf16_bits(synthetic_kv())
    for mode in ("raw", "bf16"):
        dst, wire = round_trip(bits, mode, kv_dtype="bfloat16")
        assert dst.tobytes() == bits.tobytes() and wire == bits.nbytes


def test_raw_with_token_split_chunks_is_bit_exact():
    kv = synthetic_kv(tokens=300)
    dst, _ = round_trip(kv, "raw", chunk_bytes=16 * 4 * 7)   # 7 tokens per chunk, one plane
    assert dst.tobytes() == kv.tobytes()


def test_bf16_error_is_within_half_an_ulp():
    kv = synthetic_kv()
    dst, wire = round_trip(kv, "bf16")
    assert wire == kv.nbytes // 2
    assert (np.abs(dst - kv) <= np.abs(kv) * 2.0**-8).all()


def int8_bound(kv):
    low, high = kv.min(axis=-1, keepdims=True), kv.max(axis=-1, keepdims=True)
    widened = (high - low) + (np.abs(low) + np.abs(high)) * 2.0**-9 + 2.0**-22
    return widened / 510 * 1.0001 + 1e-7


def test_int8_error_is_within_half_a_step_per_row():
    kv = synthetic_kv()
    dst, wire = round_trip(kv, "int8")
    assert (np.abs(dst - kv) <= int8_bound(kv)).all()
    rows = kv.size // kv.shape[-1]
    assert wire == kv.size + rows * 4                     # 1 byte per value + float16 lo, hi per row


def test_int8_sym_error_is_within_half_a_scale():
    kv = synthetic_kv()
    dst, _ = round_trip(kv, "int8_sym")
    amax = np.abs(kv).max(axis=-1, keepdims=True)
    assert (np.abs(dst - kv) <= amax / 127 * (1 + 2.0**-9) / 2 + 1e-7).all()


@pytest.mark.parametrize("mode", ["int8", "int8_sym"])
def test_constant_and_zero_rows_decode_exactly_enough(mode):
    kv = np.zeros((1, 2, 1, 4, 8), np.float32)
    kv[0, 0, 0, 1] = 3.25
    dst, _ = round_trip(kv, mode)
    assert np.abs(dst - kv).max() <= 3.25 * 2.0**-8


def test_int8_falls_back_to_float32_params_beyond_float16_range():
    kv = synthetic_kv() * 1e4
    kv[0, 0, 0, 0, 0] = 1e6
    quantizer = NumpyQuantizer()
    info = numpy_kv_info(kv)
    spec = plan_chunks(info, 10**9)[0]
    outs = [np.empty(n, np.uint8) for n in max_payload_sizes("int8", spec.num_rows, info)]
    assert quantizer.encode(kv, info, spec, "int8", outs).scale_dtype == "f32"
    dst, _ = round_trip(kv, "int8")
    assert (np.abs(dst - kv) <= int8_bound(kv)).all()


@pytest.mark.parametrize("mode", ["int8", "int8_sym"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_kv_cannot_be_int8_encoded(mode, bad):
    kv = synthetic_kv()
    kv[1, 0, 1, 3, 2] = bad
    with pytest.raises(KVValueError, match="non-finite"):
        round_trip(kv, mode)


@pytest.mark.parametrize("dst_dtype", [np.float16, np.uint16])
@pytest.mark.parametrize("mode", ["raw", "bf16", "int8"])
def test_decodes_into_the_engines_dtype(mode, dst_dtype):
    kv = synthetic_kv()
    dst, _ = round_trip(kv, mode, dst_dtype=dst_dtype)
    values = bf16_bits_to_f32(dst) if dst_dtype == np.uint16 else dst.astype(np.float32)
    assert np.abs(values - kv).max() <= np.abs(kv).max() * 2.0**-7


def test_int8_from_bf16_source():
    bits = f32_to_bf16_bits(synthetic_kv())
    dst, _ = round_trip(bits, "int8", dst_dtype=np.float32, kv_dtype="bfloat16")
    source = bf16_bits_to_f32(bits)
    assert (np.abs(dst - source) <= int8_bound(source)).all()


def test_bad_inputs_get_clear_errors():
    quantizer = NumpyQuantizer()
    with pytest.raises(KVValueError):
        quantizer.kv_info(object())
    with pytest.raises(KVValueError):
        quantizer.kv_info(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(KVValueError):
        quantizer.dst_dtype(np.zeros(3, np.int32))
    info = numpy_kv_info(synthetic_kv())
    spec = plan_chunks(info)[0]
    with pytest.raises(KVFrameError):
        payload_sizes("int4", spec, info)
    with pytest.raises(KVFrameError):
        payload_sizes("int8", spec, info, "f64")


def test_reads_any_buffer_protocol_or_dlpack_source():
    kv = synthetic_kv()
    quantizer = NumpyQuantizer()
    assert quantizer.kv_info(memoryview(kv)).shape == kv.shape
    assert quantizer.kv_info(kv).dtype == "float32"
