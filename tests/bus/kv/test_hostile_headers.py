"""A hostile or buggy peer's header frames: decode_message raises KVFrameError and nothing else,
quickly, allocating nothing in proportion to what a header claims.

Every frame here carries a valid xxh3 trailer computed over the mutated body (conftest.seal), so it
gets past the checksum to the field checks (docs/PROTOCOL.md part 2, "Field rules")."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgpack import ExtType, Timestamp

from bus.kv.chunk_codec import ChunkEncoder
from bus.kv.frames import (
    ABORT,
    ACK,
    CHUNK,
    DONE,
    END,
    NACK,
    Chunk,
    _chunk_fields,
    decode_message,
    encode_message,
)
from bus.kv.kv_errors import KVFrameError, KVValueError
from bus.kv.quant import MODES, NumpyQuantizer
from tests.bus.kv.conftest import seal, synthetic_kv

KV = synthetic_kv(layers=2, heads=1, tokens=8, head_dim=8)
HOSTILE = [None, True, 1.5, float("nan"), -1, 2**31, 2**63 - 1, 2**64 - 1, -2**63, "", "x" * 2000, b"\x00",
           [], [1, 2], [[[]]], {}, {"k": [1]}, ExtType(5, b"x"), Timestamp(1, 0)]
FIELD = {name: i for i, name in enumerate(Chunk.__slots__)}
CONTROL = {END: ["t1", "r1", 4, 1000, 5], ABORT: ["t1", "why"], ACK: ["t1", 3], NACK: ["t1", -1, "missing"],
           DONE: ["t1", True, "", 0, 0]}


def valid_chunk(mode: str = "int8", compression: str = "none") -> tuple[list, list[bytes]]:
    """The header fields and wire payload of a real chunk."""
    encoder = ChunkEncoder(KV, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode=mode,
                           compression=compression, chunk_bytes=8 * 8 * 4)
    header, wire = encoder.encode(0, [np.empty(n, np.uint8) for n in encoder.buffer_sizes()])
    fields = _chunk_fields(header)
    fields[FIELD["shape"]] = list(header.shape)
    return fields, [bytes(memoryview(f).cast("B")) for f in wire]


def decode_or_refuse(frames: list) -> object | None:
    """The message, or None when refused; any exception but KVFrameError fails the test."""
    try:
        return decode_message(frames)[0]
    except KVFrameError:
        return None


def short(value) -> str:
    return repr(value)[:24]


@pytest.mark.parametrize("value", HOSTILE, ids=short)
@pytest.mark.parametrize("name", Chunk.__slots__)
def test_a_hostile_value_in_any_chunk_field_raises_only_frame_errors(name, value):
    fields, payload = valid_chunk()
    fields[FIELD[name]] = value
    decode_or_refuse([seal(CHUNK, fields), *payload])


@pytest.mark.parametrize("value", HOSTILE, ids=short)
@pytest.mark.parametrize(("field", "position"), [("shape", i) for i in range(5)] + [("frames", i) for i in range(2)])
def test_a_hostile_value_inside_shape_or_frames_raises_only_frame_errors(field, position, value):
    fields, payload = valid_chunk()
    fields[FIELD[field]][position] = value
    decode_or_refuse([seal(CHUNK, fields), *payload])


@pytest.mark.parametrize("value", HOSTILE, ids=short)
@pytest.mark.parametrize("position", range(4))
def test_a_hostile_value_inside_a_frame_entry_raises_only_frame_errors(position, value):
    fields, payload = valid_chunk("raw")
    fields[FIELD["frames"]][0][position] = value
    decode_or_refuse([seal(CHUNK, fields), *payload])


@pytest.mark.parametrize("value", HOSTILE, ids=short)
@pytest.mark.parametrize(("kind", "position"), [(k, i) for k, fields in CONTROL.items() for i in range(len(fields))])
def test_a_hostile_value_in_any_control_field_raises_only_frame_errors(kind, position, value):
    fields = list(CONTROL[kind])
    fields[position] = value
    decode_or_refuse([seal(kind, fields)])


def test_unhashable_dtype_mode_scale_and_codec_are_frame_errors():
    """Found by review: a list or dict where a string belongs raised TypeError out of decode_message."""
    for name in ("dtype", "mode", "scale_dtype"):
        for value in ([], {}):
            fields, payload = valid_chunk()
            fields[FIELD[name]] = value
            with pytest.raises(KVFrameError):
                decode_message([seal(CHUNK, fields), *payload])
    fields, payload = valid_chunk()
    fields[FIELD["frames"]][0][0] = ["none"]
    with pytest.raises(KVFrameError):
        decode_message([seal(CHUNK, fields), *payload])


@pytest.mark.parametrize("shuffle", [2.0, False, True])
def test_a_shuffle_of_another_type_is_refused(shuffle):
    fields, payload = valid_chunk("int8", "zstd")
    fields[FIELD["frames"]][0][1] = shuffle
    with pytest.raises(KVFrameError):
        decode_message([seal(CHUNK, fields), *payload])


def bounded(claim: list, limit_bytes: int = 1 << 20, limit_s: float = 0.5) -> None:
    """decode_message refuses `claim` (chunk fields) within the time and memory limits."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(KVFrameError):
            decode_message([seal(CHUNK, claim)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < limit_s and peak < limit_bytes


def claim(shape, mode, planes, tokens, frames, num_chunks=1, scale="") -> list:
    return ["t1", "r1", shape, "float32", mode, 0, num_chunks, 0, *planes, *tokens, scale, frames, 0, 0]


@pytest.mark.timeout(20)
def test_huge_ranges_are_refused_before_any_frame_is_built():
    """Rows of 4 MiB are a frame each: the old frame_specs built one object per row of a 2**61-row
    range before any size check."""
    bounded(claim([2**30, 2, 1, 2**30, 2**20], "raw", (0, 2**31), (0, 2**30), [["none", 0, 4, 4]]))
    bounded(claim([1, 2, 1, 2**20, 2**19], "raw", (0, 1), (0, 2**20), [["none", 0, 4, 4]]))


def test_a_frames_list_longer_than_the_chunk_can_have_is_refused_before_building_it():
    fields, _ = valid_chunk("raw")
    bounded(fields[:FIELD["frames"]] + [[["none", 0, 4, 4]] * 3000] + fields[FIELD["frames"] + 1:],
            limit_bytes=2 << 20)


def test_num_chunks_beyond_what_the_shape_can_be_cut_into_is_refused():
    fields, payload = valid_chunk()
    rows = 2 * 2 * 1 * 8      # planes x tokens: every chunk holds at least one row
    for count in (rows + 1, 2**31 - 1):
        fields[FIELD["num_chunks"]] = count
        with pytest.raises(KVFrameError, match="num_chunks"):
            decode_message([seal(CHUNK, fields), *payload])
    fields[FIELD["num_chunks"]] = rows
    assert decode_message([seal(CHUNK, fields), *payload])[0].num_chunks == rows


def test_a_kv_beyond_the_byte_bound_is_refused():
    from bus.kv.header_checks import MAX_KV_BYTES
    shape = [2**20, 2, 2**10, 2**20, 2**10]   # every dim in range, 2**61 values
    with pytest.raises(KVFrameError, match="shape"):
        decode_message([seal(CHUNK, claim(shape, "int8", (0, 1), (0, 1), [["none", 0, 1024, 1024],
                                                                         ["none", 0, 8, 8]], scale="f32"))])
    assert MAX_KV_BYTES < 2**61 * 4


def test_a_chunk_beyond_the_chunk_bound_is_refused_before_decompressing():
    """2**31 int8 codes claimed by a zstd frame of a few bytes: a decompression bomb."""
    shape = [1, 2, 1, 2**20, 2**11]           # 16 GiB of float32: within the KV bound
    frames = [["zstd", 0, 2**31, 16], ["zstd", 0, 2**20 * 8, 16]]
    with pytest.raises(KVFrameError, match="chunk"):
        decode_message([seal(CHUNK, claim(shape, "int8", (0, 1), (0, 2**20), frames, scale="f32")), b"x" * 16,
                        b"y" * 16])


def test_a_wire_length_beyond_what_a_codec_can_expand_to_is_refused():
    fields, _ = valid_chunk("int8", "zstd")
    entry = fields[FIELD["frames"]][0]
    entry[3] = entry[2] * 2 + 4096
    with pytest.raises(KVFrameError, match="wire"):
        decode_message([seal(CHUNK, fields), b"x" * entry[3], b"y" * fields[FIELD["frames"]][1][3]])


def test_a_header_frame_beyond_the_header_bound_is_refused_unread():
    from bus.kv.header_checks import MAX_HEADER_BYTES
    with pytest.raises(KVFrameError, match="header"):
        decode_message([seal(ABORT, ["t1", "x" * MAX_HEADER_BYTES])])


# ---- properties: arbitrary values anywhere, and plausible-looking headers with huge numbers ----

leaves = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
          | st.binary(max_size=8))
values = st.recursive(leaves, lambda children: st.lists(children, max_size=4)
                      | st.dictionaries(st.text(max_size=4), children, max_size=3), max_leaves=12)
properties = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASES = {mode: valid_chunk(mode) for mode in MODES}


@properties
@given(st.sampled_from(sorted(BASES)), st.lists(st.tuples(st.integers(0, 22), values), min_size=1, max_size=4),
       st.integers(-1, 1))
def test_arbitrary_mutations_raise_only_frame_errors(mode, mutations, resize):
    fields, payload = BASES[mode]
    fields = [list(f) if isinstance(f, list) else f for f in fields]
    fields[FIELD["frames"]] = [list(e) for e in fields[FIELD["frames"]]]
    for where, value in mutations:
        if where < 16:
            fields[where] = value
        elif where < 21:
            if isinstance(fields[FIELD["shape"]], list) and len(fields[FIELD["shape"]]) > where - 16:
                fields[FIELD["shape"]][where - 16] = value
        elif isinstance(fields[FIELD["frames"]], list) and fields[FIELD["frames"]]:
            entry = fields[FIELD["frames"]][0]
            if isinstance(entry, list) and entry:
                entry[(where - 21) % len(entry)] = value
    fields = fields[:resize] if resize < 0 else fields + [None] * resize
    decode_or_refuse([seal(CHUNK, fields), *payload])


@properties
@given(st.sampled_from([CHUNK, END, ABORT, ACK, NACK, DONE, 4, 99]), st.lists(values, max_size=17))
def test_arbitrary_field_lists_of_any_kind_raise_only_frame_errors(kind, fields):
    decode_or_refuse([seal(kind, fields)])


huge = st.one_of(st.integers(0, 16), st.integers(0, 2**31), st.sampled_from([2**31 - 1, 2**30, 2**20, 2**40]))


@properties
@given(st.lists(st.integers(1, 2**31 - 1) | st.integers(1, 64), min_size=5, max_size=5),
       st.sampled_from(MODES), st.tuples(huge, huge, huge, huge, huge, huge),
       st.lists(st.tuples(st.sampled_from(["none", "lz4", "zstd"]), st.sampled_from([0, 2, 4]), huge, huge),
                max_size=6))
def test_plausible_headers_with_huge_numbers_are_decided_quickly_in_little_memory(shape, mode, numbers, frames):
    """Ranges drawn as start + length, so many of them lie within the (huge) shape."""
    shape[1] = 2
    count, index, p0, planes, t0, tokens = numbers
    fields = ["t1", "r1", shape, "float32", mode, 0, count, index, p0, p0 + planes, t0, t0 + tokens,
              "f32" if mode.startswith("int8") else "", [list(f) for f in frames], 0, 0]
    tracemalloc.start()
    started = time.perf_counter()
    try:
        decode_or_refuse([seal(CHUNK, fields)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5 and peak < 1 << 20


# ---- what a sender makes always passes the checks; what they refuse it does not make ----

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 300), st.sampled_from([1, 8, 64, 80]),
       st.sampled_from(MODES), st.sampled_from(["none", "lz4", "zstd"]), st.integers(64, 1 << 20),
       st.sampled_from(["float32", "bfloat16"]), st.integers(0, 2**32))
def test_every_chunk_a_sender_makes_passes_the_checks(layers, heads, tokens, head_dim, mode, compression,
                                                      chunk_bytes, dtype, seed):
    """Incompressible values: compressed frames come out a little longer than raw, within wire_bound."""
    rng = np.random.default_rng(seed)
    kv = rng.standard_normal((layers, 2, heads, tokens, head_dim)).astype(np.float32)
    source = kv if dtype == "float32" else rng.integers(0, 2**16, kv.shape, dtype=np.uint16) & 0xBFFF
    encoder = ChunkEncoder(source, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode=mode,
                           compression=compression, chunk_bytes=chunk_bytes, dtype=dtype)
    outs = [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
    for index in range(encoder.num_chunks):
        header, wire = encoder.encode(index, outs)
        assert decode_message([bytes(memoryview(f).cast("B")) for f in encode_message(header, wire)])[0] == header


def test_a_sender_refuses_a_plan_every_receiver_would_refuse(monkeypatch):
    import bus.kv.chunk_codec as chunk_codec
    monkeypatch.setattr(chunk_codec, "MAX_CHUNKS", 3)
    with pytest.raises(KVValueError, match="chunks"):
        ChunkEncoder(KV, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode="raw", compression="none",
                     chunk_bytes=64)
    monkeypatch.setattr(chunk_codec, "MAX_CHUNKS", 2**20)
    monkeypatch.setattr(chunk_codec, "MAX_CHUNK_BYTES", 100)
    with pytest.raises(KVValueError, match="bytes a chunk"):
        ChunkEncoder(KV, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode="raw", compression="none",
                     chunk_bytes=1024)
