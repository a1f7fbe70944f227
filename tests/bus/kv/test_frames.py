"""Wire messages: round trips, validation of every header field, corruption is always detected."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.kv import RawPieces
from bus.kv.chunk_codec import ChunkEncoder, verify_and_decode
from bus.kv.compress import AutoCompression
from bus.kv.frames import (
    Abort,
    Ack,
    Chunk,
    Done,
    End,
    FrameInfo,
    Nack,
    _chunk_fields,
    decode_header,
    decode_message,
    encode_header,
    encode_message,
)
from bus.kv.kv_errors import KVChecksumError, KVError, KVFrameError
from bus.kv.layout import FRAME_BYTES, f32_to_bf16_bits
from bus.kv.quant import NumpyQuantizer
from tests.bus.kv.conftest import seal, synthetic_kv

KV = synthetic_kv(layers=2, heads=1, tokens=8, head_dim=8)


def encoded_chunk(mode="int8", compression="none", index=0):
    encoder = ChunkEncoder(KV, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode=mode,
                           compression=compression, chunk_bytes=8 * 8 * 4)
    outs = [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
    header, wire = encoder.encode(index, outs)
    return header, [bytes(memoryview(f).cast("B")) for f in wire]


@pytest.mark.parametrize("message", [
    End("t1", "r1", 4, 1000, 2**64 - 1), Abort("t1", "client went away"), Ack("t1", 3),
    Nack("t1", -1, "missing"), Done("t1", False, "timed out", 2, 1), Done("t1", True, "", 0, 0),
])
def test_control_messages_round_trip(message):
    decoded, payload = decode_message(encode_message(message))
    assert decoded == message and payload == []


@pytest.mark.parametrize("mode", ["raw", "bf16", "int8", "int8_sym"])
@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_chunks_round_trip_and_decode(mode, compression):
    header, wire = encoded_chunk(mode, compression)
    decoded, payload = decode_message(encode_message(header, wire))
    assert decoded == header
    dst = np.zeros_like(KV)
    verify_and_decode(decoded, payload, NumpyQuantizer(), dst)
    assert np.abs(dst[0, 0, 0] - KV[0, 0, 0]).max() < 0.1


# One invalid value per header field: each must be refused with KVFrameError.
BAD_CHUNK_FIELDS = {
    "transfer_id": ["", 5, "x" * 200], "request_id": ["", None],
    "shape": [[2, 3, 1, 8, 8], [2, 2, 1, 8], [2, 2, 0, 8, 8], "2,2,1,8,8", [2, 2, 1, 8, 8.0]],
    "dtype": ["int8", None], "mode": ["int4", ""], "token_offset": [-1, "0"],
    "num_chunks": [0, -2], "index": [4, -1, True], "plane_start": [4, -1], "plane_stop": [0, 5],
    "token_start": [8, -1], "token_stop": [0, 9], "scale_dtype": ["", "f64"],
    "frames": [[], [[0, 0, 1, 1]], [["lz5", 0, 64, 10], ["none", 0, 8, 8]], "frames"],
    "checksum": [-1, 1.5, "0"], "attempt": [-1, 2**16],
}


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, values in BAD_CHUNK_FIELDS.items() for v in values])
def test_every_chunk_header_field_is_validated(name, value):
    header, _ = encoded_chunk()
    fields = _chunk_fields(header)
    fields[Chunk.__slots__.index(name)] = value
    with pytest.raises(KVFrameError):
        decode_header(seal(1, fields))


def test_payload_sizes_must_match_the_mode_and_range():
    header, _ = encoded_chunk()
    wrong = replace(header, frames=(replace(header.frames[0], raw_len=63, wire_len=63), header.frames[1]))
    with pytest.raises(KVFrameError, match="payload sizes"):
        decode_header(encode_header(wrong))
    stored_shuffled = replace(header, frames=(FrameInfo("none", 2, 64, 64), header.frames[1]))
    with pytest.raises(KVFrameError):
        decode_header(encode_header(stored_shuffled))


@pytest.mark.parametrize(("kind", "fields"), [
    (2, ["t1", "r1", 0, 10, 5]), (2, ["t1", "r1", 1, -1, 5]), (3, ["", "x"]), (17, ["t1", -1]),
    (18, ["t1", -2, "x"]), (19, ["t1", 1, "x", 0, 0]), (19, ["t1", True, "x", -1, 0]), (17, ["t1"]),
    (99, ["t1", 1]),
])
def test_control_fields_are_validated(kind, fields):
    with pytest.raises(KVFrameError):
        decode_header(seal(kind, fields))


def test_bad_magic_version_and_garbage_are_refused():
    frame = encode_header(Ack("t1", 1))
    previous_version = frame[:4] + b"\x01" + frame[5:]   # version 1 sent raw chunks as one frame
    for broken in (b"XXXX" + frame[4:], frame[:4] + b"\x07" + frame[5:], previous_version, b"", b"PDKV", frame[:-1]):
        with pytest.raises(KVFrameError):
            decode_header(broken)
    with pytest.raises(KVFrameError, match="unsupported KV protocol version 1"):
        decode_header(previous_version)
    with pytest.raises(KVFrameError):
        decode_header(seal(17, {"not": "a list"}))
    with pytest.raises(KVFrameError):
        decode_message([])


# ---- corruption is always detected, and only the codec's own error escapes ----

def message_frames(compression: str) -> list[bytes]:
    header, wire = encoded_chunk("int8", compression, index=1)
    return [bytes(f) for f in encode_message(header, wire)]


def receive(frames) -> None:
    """What a receiver does with a message: parse, verify, decode; raises KVError on any fault."""
    message, payload = decode_message(frames)
    if isinstance(message, Chunk):
        verify_and_decode(message, payload, NumpyQuantizer(), np.zeros_like(KV))


FRAMES = {c: message_frames(c) for c in ("none", "lz4", "zstd")}
settings_ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings_
@given(st.sampled_from(sorted(FRAMES)), st.data())
def test_any_bit_flip_is_detected(compression, data):
    frames = [bytearray(f) for f in FRAMES[compression]]
    which = data.draw(st.integers(0, len(frames) - 1))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(frames[which]) - 1), st.integers(0, 7)),
                               min_size=1, max_size=4, unique=True))
    for position, bit in flips:
        frames[which][position] ^= 1 << bit
    if [bytes(f) for f in frames] == FRAMES[compression]:
        return  # flips cancelled out
    with pytest.raises(KVError):
        receive([bytes(f) for f in frames])


@settings_
@given(st.sampled_from(sorted(FRAMES)), st.data())
def test_truncation_or_extension_is_detected(compression, data):
    frames = list(FRAMES[compression])
    which = data.draw(st.integers(0, len(frames) - 1))
    cut = data.draw(st.integers(0, len(frames[which]) - 1))
    extra = data.draw(st.binary(max_size=8))
    frames[which] = frames[which][:cut] + extra if extra != frames[which][cut:] else frames[which][:cut]
    with pytest.raises(KVError):
        receive(frames)


@settings_
@given(st.sampled_from(sorted(FRAMES)), st.permutations(range(3)))
def test_reordered_frames_are_detected(compression, order):
    frames = FRAMES[compression]
    if list(order) == [0, 1, 2]:
        return
    with pytest.raises(KVError):
        receive([frames[i] for i in order])


@settings_
@given(st.sampled_from(sorted(FRAMES)), st.integers(0, 2), st.integers(0, 3))
def test_duplicated_or_dropped_frames_are_detected(compression, which, position):
    frames = list(FRAMES[compression])
    duplicated = frames[:position] + [frames[which]] + frames[position:]
    with pytest.raises(KVError):
        receive(duplicated)
    with pytest.raises(KVError):
        receive(frames[:which] + frames[which + 1:])


@settings_
@given(st.sampled_from(sorted(FRAMES)), st.data())
def test_lying_lengths_are_detected(compression, data):
    header, payload = decode_message(FRAMES[compression])
    which = data.draw(st.integers(0, len(header.frames) - 1))
    frame = header.frames[which]
    field = data.draw(st.sampled_from(["raw_len", "wire_len"]))
    value = data.draw(st.integers(0, 2**20).filter(lambda v: v != getattr(frame, field)))
    infos = list(header.frames)
    infos[which] = replace(frame, **{field: value})
    with pytest.raises(KVError):
        receive([encode_header(replace(header, frames=tuple(infos))), *payload])


def test_a_valid_header_over_a_swapped_payload_fails_the_checksum():
    header, wire = encoded_chunk("int8", "none", index=0)
    _, other = encoded_chunk("int8", "none", index=1)
    with pytest.raises(KVChecksumError):
        verify_and_decode(header, other, NumpyQuantizer(), np.zeros_like(KV))


def test_a_failed_chunk_writes_nothing():
    header, wire = encoded_chunk("int8", "none", index=0)
    dst = np.full_like(KV, 7.0)
    corrupt = [wire[0][:-1] + bytes([wire[0][-1] ^ 1]), wire[1]]
    with pytest.raises(KVChecksumError):
        verify_and_decode(header, corrupt, NumpyQuantizer(), dst)
    assert (dst == 7.0).all()


# ---- raw and bf16 chunks larger than a frame travel as several frames ----

BIG_KV = np.random.default_rng(3).standard_normal((2, 2, 3, 1024, 64), dtype=np.float32)   # one 3 MiB chunk


def big_chunk(mode: str, compression: str = "none", auto=None):
    source = f32_to_bf16_bits(BIG_KV) if mode == "raw-bf16" else BIG_KV
    encoder = ChunkEncoder(source, NumpyQuantizer(), transfer_id="t1", request_id="r1", mode=mode.removesuffix("-bf16"),
                           compression=compression, auto=auto, dtype="bfloat16" if mode == "raw-bf16" else None)
    outs = [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
    assert encoder.num_chunks == 1
    return source, encoder.encode(0, outs)


@pytest.mark.parametrize(("mode", "num_frames"), [("raw", 3), ("raw-bf16", 2), ("bf16", 2)])
def test_a_chunk_larger_than_a_frame_travels_as_frames_and_decodes_bit_exact(mode, num_frames):
    source, (header, wire) = big_chunk(mode)
    assert len(wire) == len(header.frames) == num_frames
    assert all(f.raw_len <= FRAME_BYTES for f in header.frames)
    decoded, payload = decode_message([bytes(f) for f in encode_message(header, wire)])
    dst = np.zeros_like(source)
    verify_and_decode(decoded, payload, NumpyQuantizer(), dst)
    expected = source if mode != "bf16" else f32_to_bf16_bits(BIG_KV)
    assert (dst if mode != "bf16" else f32_to_bf16_bits(dst)).tobytes() == expected.tobytes()


def test_a_raw_chunk_is_kept_as_one_piece_a_frame():
    _, (header, wire) = big_chunk("raw")
    decoded, payload = decode_message(encode_message(header, wire))
    pieces = RawPieces(decoded.info)
    verify_and_decode(decoded, payload, NumpyQuantizer(), pieces)
    assert pieces.num_pieces == 3 and pieces.to_numpy().tobytes() == BIG_KV.tobytes()


def test_a_raw_chunk_sent_as_one_frame_is_refused():
    """Version 2 cuts raw payloads into frames; one frame of the whole chunk (as version 1 sent
    it) does not match the sizes the header must carry."""
    _, (header, wire) = big_chunk("raw")
    whole = b"".join(bytes(f) for f in wire)
    merged = replace(header, frames=(FrameInfo("none", 0, len(whole), len(whole)),))
    with pytest.raises(KVFrameError, match="payload sizes"):
        decode_message(encode_message(merged, [whole]))


def test_auto_decides_once_for_all_frames_of_a_raw_chunk():
    class Recording(AutoCompression):
        def choose(self, slot, data, itemsize):
            self.calls.append((slot, itemsize))
            return super().choose(slot, data, itemsize)

    auto = Recording(1e9)
    auto.calls = []
    _, (header, _) = big_chunk("raw", "auto", auto)
    assert auto.calls == [(("raw", "float32", 0), 4)]   # asked once for the chunk's three frames
    assert len(header.frames) == 3 and len({(f.codec, f.shuffle) for f in header.frames}) == 1


def test_auto_is_asked_per_frame_kind_of_an_int8_chunk():
    """int8's frames are two kinds (codes, params): each gets its own decision."""
    class Recording(AutoCompression):
        def choose(self, slot, data, itemsize):
            self.calls.append(slot)
            return super().choose(slot, data, itemsize)

    auto = Recording(1e9)
    auto.calls = []
    big_chunk("int8", "auto", auto)
    assert auto.calls == [("int8", "float32", 0), ("int8", "float32", 1)]
