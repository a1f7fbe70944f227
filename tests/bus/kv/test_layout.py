"""Chunk planning and dtype helpers (bus/kv/layout.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus.kv.kv_errors import KVValueError
from bus.kv.layout import (
    DEFAULT_CHUNK_BYTES,
    FRAME_BYTES,
    ChunkSpec,
    KVInfo,
    bf16_bits_to_f32,
    chunk_bytes_for,
    f32_to_bf16_bits,
    frame_specs,
    num_frames,
    numpy_kv_info,
    plan_chunks,
)


def coverage(info: KVInfo, specs) -> np.ndarray:
    counts = np.zeros((info.num_planes, info.num_tokens), int)
    for spec in specs:
        counts[spec.planes, spec.tokens] += 1
    return counts


@pytest.mark.parametrize("chunk_bytes", [1, 100, 4096, 10_000, 60_000, 10**9])
@pytest.mark.parametrize("shape", [(3, 2, 2, 40, 16), (1, 2, 1, 1, 8), (30, 2, 3, 17, 64)])
def test_chunks_cover_every_value_exactly_once(shape, chunk_bytes):
    info = KVInfo(shape, "float32")
    specs = plan_chunks(info, chunk_bytes)
    assert (coverage(info, specs) == 1).all()
    assert [s.index for s in specs] == list(range(len(specs)))


def test_chunks_take_whole_layers_when_they_fit():
    info = KVInfo((30, 2, 3, 1024, 64), "float32")   # SmolLM2: 1.5 MiB per layer in fp32
    specs = plan_chunks(info, 2 * 1024 * 1024)
    assert len(specs) == 30
    assert all(s.plane_stop - s.plane_start == 6 and s.token_stop - s.token_start == 1024 for s in specs)


def test_a_plane_larger_than_a_chunk_is_split_by_tokens():
    info = KVInfo((1, 2, 1, 1000, 64), "float32")   # 256 KB per plane
    specs = plan_chunks(info, 64 * 1024)
    assert {s.plane_stop - s.plane_start for s in specs} == {1}
    assert max(s.token_stop - s.token_start for s in specs) == 256


def row_numbers(info: KVInfo, spec) -> list[int]:
    """The chunk's rows as (plane, token) numbers, in the order its payload holds them."""
    return [p * info.num_tokens + t for p in range(spec.plane_start, spec.plane_stop)
            for t in range(spec.token_start, spec.token_stop)]


@pytest.mark.parametrize("frame_bytes", [1, 64, 1000, 4096, 10**9])
@pytest.mark.parametrize("chunk_bytes", [100, 4096, 60_000, 10**9])
@pytest.mark.parametrize("shape", [(3, 2, 2, 40, 16), (1, 2, 1, 1, 8), (2, 2, 3, 17, 64)])
def test_a_chunks_frames_are_its_rows_in_order_each_within_the_frame_size(shape, chunk_bytes, frame_bytes):
    info = KVInfo(shape, "float32")
    row_bytes = info.head_dim * 4
    for spec in plan_chunks(info, chunk_bytes):
        frames = frame_specs(spec, info, 4, frame_bytes)
        assert [row for frame in frames for row in row_numbers(info, frame)] == row_numbers(info, spec)
        assert {frame.index for frame in frames} == {spec.index}
        assert all(frame.num_rows * row_bytes <= max(frame_bytes, row_bytes) for frame in frames)
        assert len(frames) == 1 or spec.num_rows * row_bytes > frame_bytes


def test_smollm2_chunks_travel_as_frames_of_whole_planes():
    """A 1024-token SmolLM2 chunk of whole layers goes as frames of whole planes within 1 MiB."""
    bf16, fp32 = KVInfo((30, 2, 3, 1024, 64), "bfloat16"), KVInfo((30, 2, 3, 1024, 64), "float32")
    [first_bf16, *_] = plan_chunks(bf16, DEFAULT_CHUNK_BYTES)
    [first_fp32, *_] = plan_chunks(fp32, DEFAULT_CHUNK_BYTES)
    assert FRAME_BYTES == 1 << 20
    assert [f.plane_stop - f.plane_start for f in frame_specs(first_bf16, bf16, 2)] == [8, 8, 8, 6]   # 128 KiB planes
    assert [f.plane_stop - f.plane_start for f in frame_specs(first_fp32, fp32, 4)] == [4, 4, 4]      # 256 KiB planes
    long = KVInfo((1, 2, 1, 16384, 64), "float32")   # a 4 MiB plane: split by tokens, 4096 a frame
    [spec, *_] = plan_chunks(long, DEFAULT_CHUNK_BYTES)
    assert [f.token_stop - f.token_start for f in frame_specs(spec, long, 4)] == [4096] * 4


@pytest.mark.parametrize("shape", [(3, 3, 2, 4, 8), (3, 2, 2, 4), (0, 2, 1, 1, 1)])
def test_bad_shapes_are_refused(shape):
    with pytest.raises(KVValueError):
        KVInfo(shape, "float32")


def test_bad_dtype_and_chunk_size_are_refused():
    with pytest.raises(KVValueError):
        KVInfo((1, 2, 1, 1, 1), "int8")
    with pytest.raises(KVValueError):
        plan_chunks(KVInfo((1, 2, 1, 1, 1), "float32"), 0)
    with pytest.raises(KVValueError):
        frame_specs(plan_chunks(KVInfo((1, 2, 1, 1, 1), "float32"))[0], KVInfo((1, 2, 1, 1, 1), "float32"), 4, 0)
    with pytest.raises(KVValueError):
        numpy_kv_info(np.zeros((1, 2, 1, 1, 1), np.uint16))   # bf16 must be said explicitly
    with pytest.raises(KVValueError):
        numpy_kv_info(np.zeros((1, 2, 1, 1, 1), np.float32), "bfloat16")


def test_bf16_conversion_rounds_to_nearest_even_and_keeps_specials():
    values = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, -np.inf, np.nan, 0.0, 3.0e38], np.float32)
    bits = f32_to_bf16_bits(values)
    back = bf16_bits_to_f32(bits)
    assert back[0] == 1.0 and back[1] == 1.0           # halfway 1 + 2**-8 ties to even (1.0)
    assert back[2] == np.float32(1.015625)             # halfway 1 + 3 * 2**-8 ties to even (up)
    assert back[3] == -2.5 and back[7] == 0.0
    assert np.isposinf(back[4]) and np.isneginf(back[5]) and np.isnan(back[6])
    assert np.isfinite(back[8])


def test_bf16_relative_error_is_at_most_half_an_ulp():
    values = np.random.default_rng(1).normal(size=10_000).astype(np.float32) * 100
    back = bf16_bits_to_f32(f32_to_bf16_bits(values))
    assert (np.abs(back - values) <= np.abs(values) * 2.0**-8).all()


def test_quantized_chunks_are_sized_by_values_raw_ones_by_bytes():
    fp32, bf16 = KVInfo((30, 2, 3, 1024, 64), "float32"), KVInfo((30, 2, 3, 1024, 64), "bfloat16")
    assert chunk_bytes_for(fp32, "raw") == chunk_bytes_for(bf16, "raw") == DEFAULT_CHUNK_BYTES
    for mode in ("int8", "int8_sym", "bf16"):
        assert chunk_bytes_for(fp32, mode) == 2 * DEFAULT_CHUNK_BYTES   # as many values as 4 MiB of bf16
        assert chunk_bytes_for(bf16, mode) == DEFAULT_CHUNK_BYTES
    assert len(plan_chunks(fp32, chunk_bytes_for(fp32, "int8"))) == len(plan_chunks(bf16, chunk_bytes_for(bf16, "int8")))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 300), st.integers(1, 96), st.sampled_from([2, 4]),
       st.integers(1, 5000), st.data())
def test_num_frames_counts_frame_specs_without_building_them(layers, heads, tokens, head_dim, value_bytes,
                                                             frame_bytes, data):
    info = KVInfo((layers, 2, heads, tokens, head_dim), "float32")
    p0 = data.draw(st.integers(0, info.num_planes - 1))
    t0 = data.draw(st.integers(0, tokens - 1))
    spec = ChunkSpec(0, p0, data.draw(st.integers(p0 + 1, info.num_planes)), t0, data.draw(st.integers(t0 + 1, tokens)))
    assert num_frames(spec, info, value_bytes, frame_bytes) == len(frame_specs(spec, info, value_bytes, frame_bytes))
