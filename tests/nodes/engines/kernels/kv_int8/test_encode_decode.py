"""The numba int8 kernels are bit-identical to the numpy reference (codes, params, decoded values)."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv.layout import KVInfo, bf16_bits_to_f32, f32_to_bf16_bits, plan_chunks
from bus.kv.quant import NumpyQuantizer, max_payload_sizes
from nodes.engines.kernels.kv_int8 import decode as int8_decode
from nodes.engines.kernels.kv_int8 import encode as int8_kernels

pytestmark = pytest.mark.skipif(not int8_kernels.AVAILABLE, reason="numba is not installed")


def reference_encode(rows: np.ndarray, dtype: str = "float32"):
    """(codes, params bytes, scale_dtype) of the numpy reference for rows (R, D)."""
    info = KVInfo((1, 2, 1, rows.shape[0] // 2, rows.shape[1]), dtype)
    spec = plan_chunks(info, 10**12)[0]
    outs = [np.empty(n, np.uint8) for n in max_payload_sizes("int8", spec.num_rows, info)]
    payload = NumpyQuantizer().encode(rows.reshape(info.shape), info, spec, "int8", outs)
    return np.array(payload.frames[0]), np.array(payload.frames[1]), payload.scale_dtype


def fast_encode(rows: np.ndarray):
    codes = np.empty(rows.shape, np.uint8)
    params = np.empty(2 * rows.shape[0], np.uint16)
    encode = int8_kernels.encode_rows if rows.dtype == np.float32 else int8_kernels.encode_bf16_rows
    fits = encode(rows, codes, params, int8_kernels.Scratch(rows.shape[1]))
    return fits, codes.reshape(-1), params.view(np.uint8)


def rows_of_every_magnitude(num_rows: int, head_dim: int, seed: int = 0) -> np.ndarray:
    """Rows whose offsets and spreads range over float16's whole span, subnormals included."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.uniform(np.log(1e-10), np.log(3e4), (num_rows, 1)))
    offset = rng.normal(size=(num_rows, 1)) * np.exp(rng.uniform(np.log(1e-10), np.log(3e4), (num_rows, 1)))
    rows = (rng.normal(size=(num_rows, head_dim)) * scale + offset).astype(np.float32)
    rows[:4] = 0.0                       # a zero row: lo/hi are the subnormal step either side
    rows[4:8] = np.float32(2.0**-24)     # constant rows on float16 boundaries
    rows[8:12] = np.float32(-(2.0**-14))
    rows[12:16] = np.float32(60000.0)    # near the top of float16's range
    return rows


@pytest.mark.parametrize("head_dim", [64, 128, 16, 80])
def test_float32_encode_is_bit_identical_to_numpy(head_dim):
    rows = rows_of_every_magnitude(4000, head_dim)
    rows = rows[np.abs(rows).max(axis=1) < 6.4e4]   # what fits float16 params (the rest: below)
    rows = rows[: len(rows) // 2 * 2]
    fits, codes, params = fast_encode(rows)
    reference_codes, reference_params, scale_dtype = reference_encode(rows)
    assert fits and scale_dtype == "f16"
    np.testing.assert_array_equal(codes, reference_codes)
    np.testing.assert_array_equal(params, reference_params)


@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_bf16_encode_is_bit_identical_to_numpy(head_dim):
    rows = f32_to_bf16_bits(rows_of_every_magnitude(2000, head_dim, seed=1)[:, :])
    rows = rows[np.abs(bf16_bits_to_f32(rows)).max(axis=1) < 6.4e4]
    rows = rows[: len(rows) // 2 * 2]
    fits, codes, params = fast_encode(rows)
    reference_codes, reference_params, _ = reference_encode(rows, "bfloat16")
    assert fits
    np.testing.assert_array_equal(codes, reference_codes)
    np.testing.assert_array_equal(params, reference_params)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 7e4, -65520.0])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_rows_the_kernel_cannot_encode_are_refused(value, head_dim):
    """Non-finite values and ranges beyond float16 go to the numpy path (error or float32 params)."""
    rows = rows_of_every_magnitude(64, head_dim) / 1e5
    rows[37, head_dim - 3] = value
    fits, _, _ = fast_encode(rows)
    assert not fits


def test_every_float16_value_survives_the_bit_conversions():
    """Decoding a row whose lo == hi gives 0 * 0 + lo: every finite float16 value, exactly."""
    values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values = values[np.isfinite(values)]
    as_bits = np.array([int8_kernels._float16_bits(np.float32(v)) for v in values], np.uint16)
    np.testing.assert_array_equal(as_bits, values.view(np.uint16))
    params = np.concatenate([values.view(np.uint16), values.view(np.uint16)])
    codes = np.zeros((1, len(values), 4), np.uint8)
    out = np.empty(codes.shape, np.float32)
    int8_decode.decode_rows(codes, params, out, int8_kernels.Scratch(4))
    expected = np.float32(0) + values.astype(np.float32)   # -0 + +0 is +0, in numpy as here
    np.testing.assert_array_equal(out[0, :, 0].view(np.uint32), expected.view(np.uint32))


def encoded_chunk(rows: np.ndarray, tokens: int):
    reference_codes, reference_params, _ = reference_encode(rows)
    codes = reference_codes.reshape(rows.shape[0] // tokens, tokens, rows.shape[1])
    return codes, reference_params.view(np.uint16)


def reference_decode(codes: np.ndarray, params: np.ndarray) -> np.ndarray:
    num_rows = codes.shape[0] * codes.shape[1]
    lo, hi = params.view(np.float16)[:num_rows], params.view(np.float16)[num_rows:]
    step = ((hi.astype(np.float32) - lo.astype(np.float32)) / np.float32(255)).reshape(codes.shape[:2] + (1,))
    return codes * step + lo.astype(np.float32).reshape(codes.shape[:2] + (1,))


@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_decode_into_float32_and_bfloat16_is_bit_identical_to_numpy(head_dim):
    rows = rows_of_every_magnitude(4000, head_dim, seed=2)
    rows = rows[np.abs(rows).max(axis=1) < 6.4e4][:3000]
    codes, params = encoded_chunk(rows, tokens=100)
    expected = reference_decode(codes, params)
    work = int8_kernels.Scratch(head_dim)
    out = np.empty(codes.shape, np.float32)
    int8_decode.decode_rows(codes, params, out, work)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    out_bf16 = np.empty(codes.shape, np.uint16)
    int8_decode.decode_rows(codes, params, out_bf16, work)
    np.testing.assert_array_equal(out_bf16, f32_to_bf16_bits(expected))


def test_decode_into_a_strided_destination_touches_only_its_rows():
    """A token-split chunk is a strided view of the engine's cache: write it, and nothing else."""
    rows = rows_of_every_magnitude(400, 64, seed=3)[:240] / 1e3
    codes, params = encoded_chunk(rows, tokens=40)          # 6 planes x 40 tokens
    cache = np.full((6, 100, 64), -7.0, np.float32)
    int8_decode.decode_rows(codes, params, cache[:, 30:70], int8_kernels.Scratch(64))
    np.testing.assert_array_equal(cache[:, 30:70], reference_decode(codes, params))
    assert (cache[:, :30] == -7.0).all() and (cache[:, 70:] == -7.0).all()


def aligned_float32(shape: tuple[int, ...], offset_bytes: int = 0) -> np.ndarray:
    """A float32 array starting `offset_bytes` past a 64-byte boundary."""
    size = int(np.prod(shape)) * 4
    raw = np.empty(size + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset_bytes
    return raw[start:start + size].view(np.float32).reshape(shape)


@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("offset_bytes", [0, 16])
def test_streaming_and_plain_decodes_into_float32_agree_bit_for_bit(head_dim, offset_bytes):
    """Aligned rows of 64 or 128 take streaming stores; others (misaligned, other widths) the plain
    loop: both give the reference's bits, into a strided view of a larger cache as well."""
    rows = rows_of_every_magnitude(800, head_dim, seed=4)
    rows = rows[np.abs(rows).max(axis=1) < 6.4e4][:600]
    codes, params = encoded_chunk(rows, tokens=50)           # 12 planes x 50 tokens
    cache = aligned_float32((codes.shape[0], 80, head_dim), offset_bytes)
    cache[:] = -7.0
    target = cache[:, 16:66]
    assert int8_decode.can_stream(target) == (offset_bytes == 0)
    int8_decode.decode_rows(codes, params, target, int8_kernels.Scratch(head_dim))
    np.testing.assert_array_equal(target.view(np.uint32), reference_decode(codes, params).view(np.uint32))
    assert (cache[:, :16] == -7.0).all() and (cache[:, 66:] == -7.0).all()


def test_only_float32_rows_on_whole_lines_can_stream():
    assert int8_decode.can_stream(aligned_float32((2, 4, 64)))
    assert not int8_decode.can_stream(aligned_float32((2, 4, 64), 32))          # misaligned start
    assert not int8_decode.can_stream(aligned_float32((2, 4, 72))[:, :, :64])   # rows 288 bytes apart
    assert not int8_decode.can_stream(aligned_float32((2, 4, 64))[:, :, ::2])   # rows not contiguous
    assert not int8_decode.can_stream(aligned_float32((2, 4, 64)).view(np.uint32).view(np.uint16))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 37, 63])
def test_non_finite_bf16_rows_are_refused_wherever_they_are(value, row):
    """The finiteness check is made once per call, over lanes every row adds into."""
    rows = f32_to_bf16_bits(rows_of_every_magnitude(64, 64) / 1e5)
    rows[row, 5] = np.array([value], np.float32).view(np.uint32)[0] >> 16   # exact bf16 NaN/inf bits
    fits, _, _ = fast_encode(rows)
    assert not fits
