"""Per-frame compression and the `auto` policy (bus/kv/compress.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv.compress import (
    MAX_RESAMPLE_EVERY,
    RESAMPLE_EVERY,
    AutoCompression,
    Choice,
    compress_frame,
    decompress_frame,
    pays_off,
    shuffle_bytes,
    unshuffle_bytes,
)
from bus.kv.kv_errors import KVFrameError

DATA = np.random.default_rng(0).normal(size=20_000).astype(np.float32).tobytes()


@pytest.mark.parametrize(("codec", "shuffle"), [("none", 0), ("lz4", 0), ("lz4", 2), ("lz4", 4),
                                                ("zstd", 0), ("zstd", 2), ("zstd", 4)])
def test_round_trip(codec, shuffle):
    wire = compress_frame(DATA, codec, shuffle)
    assert bytes(decompress_frame(wire, codec, shuffle, len(DATA))) == DATA


def test_shuffle_groups_bytes_into_planes_and_back():
    data = bytes(range(12))
    assert bytes(shuffle_bytes(data, 4)) == bytes([0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11])
    assert bytes(unshuffle_bytes(shuffle_bytes(data, 4), 4)) == data


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_corrupt_or_truncated_frames_raise_the_codec_error(codec):
    wire = bytearray(compress_frame(b"abc" * 5000, codec))
    for broken in (bytes(wire[: len(wire) // 2]), bytes(b ^ 0xFF for b in wire), b""):
        with pytest.raises(KVFrameError):
            decompress_frame(broken, codec, 0, 15000)
    with pytest.raises(KVFrameError):
        decompress_frame(bytes(wire), codec, 0, 14999)   # wrong length in the header


def test_stored_frame_length_is_checked_and_codec_names_too():
    with pytest.raises(KVFrameError):
        decompress_frame(b"abc", "none", 0, 4)
    with pytest.raises(KVFrameError):
        decompress_frame(b"abc", "brotli", 0, 3)
    with pytest.raises(KVFrameError):
        compress_frame(b"abc", "brotli")


def test_auto_stores_incompressible_data_on_a_fast_link():
    noise = np.random.default_rng(1).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    assert AutoCompression(1.25e9).choose("slot", noise, 1) == Choice("none", 0)


def test_auto_compresses_redundant_data_on_a_slow_link():
    zeros = bytes(200_000)
    assert AutoCompression(1e6).choose("slot", zeros, 4).codec in ("lz4", "zstd")


def test_auto_caches_its_choice_and_resamples():
    auto = AutoCompression(1e6)
    first = auto.choose("slot", bytes(100_000), 1)
    noise = np.random.default_rng(2).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    assert auto.choose("slot", noise, 1) == first          # cached: no sampling cost
    choices = [auto.choose("slot", noise, 1) for _ in range(RESAMPLE_EVERY)]
    assert choices[-1] == Choice("none", 0)                # re-sampled after a few chunks


def test_auto_samples_less_often_while_its_choice_holds_and_starts_over_when_it_changes():
    zeros = bytes(100_000)
    noise = np.random.default_rng(3).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    auto = AutoCompression(1e6)   # a slow link: zeros compress, noise is stored
    samples = []
    measure = auto._measure
    auto._measure = lambda data, itemsize: samples.append(1) or measure(data, itemsize)
    for _ in range(481):
        assert auto.choose("slot", zeros, 1).codec in ("lz4", "zstd")
    # sampled at chunks 1, 33, 97, 225 and 481: each confirming sample doubled the wait
    assert len(samples) == 5 and auto.resample_interval("slot") == MAX_RESAMPLE_EVERY
    for _ in range(2 * MAX_RESAMPLE_EVERY):   # capped there: one sample per MAX_RESAMPLE_EVERY chunks
        auto.choose("slot", zeros, 1)
    assert len(samples) == 7 and auto.resample_interval("slot") == MAX_RESAMPLE_EVERY
    choices = [auto.choose("slot", noise, 1) for _ in range(MAX_RESAMPLE_EVERY)]
    assert choices[-1] == Choice("none", 0)                       # the change is seen at the next sample
    assert auto.resample_interval("slot") == RESAMPLE_EVERY       # and sampling starts over, often


def test_pays_off_weighs_link_time_against_cpu_time():
    assert pays_off(1_000_000, 500_000, 0.0001, 1e8)
    assert not pays_off(1_000_000, 990_000, 0.001, 1.25e9)
