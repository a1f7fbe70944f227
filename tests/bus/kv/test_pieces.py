"""RawPieces: a raw transfer kept as its verified frames, through the sans-I/O pair and on its own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.kv import RawPieces
from bus.kv.chunk_codec import verify_and_decode
from bus.kv.frames import CHUNK, decode_message, encode_message
from bus.kv.kv_errors import KVError, KVValueError
from bus.kv.layout import ChunkSpec, KVInfo, f32_to_bf16_bits
from bus.kv.quant import NumpyQuantizer
from bus.kv.send_core import SendState
from tests.bus.kv.test_frames import KV, encoded_chunk
from tests.bus.kv.test_transfer import corrupt_first


def pieces_allocator(calls: list):
    def allocate(transfer_id, request_id, info, mode):
        calls.append(mode)
        return RawPieces(info)
    return allocate


@pytest.mark.parametrize("compression", ["none", "lz4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_raw_transfer_kept_as_pieces_is_bit_exact(make_pair, kv, compression, dtype):
    source = kv if dtype == "float32" else f32_to_bf16_bits(kv)
    modes: list = []
    pair = make_pair(source, mode="raw", compression=compression, allocate=pieces_allocator(modes), dtype=dtype)
    pair.run()
    [result] = pair.results
    assert result.ok and modes == ["raw"] and isinstance(result.kv, RawPieces)
    assert result.kv.num_pieces == pair.sender.encoder.num_chunks > 3
    assert result.kv.shape == source.shape and result.kv.num_tokens == source.shape[3]
    assert result.kv.to_numpy().tobytes() == source.tobytes()


def test_a_corrupt_raw_chunk_is_never_kept(make_pair, kv):
    pair = make_pair(kv, mode="raw", allocate=pieces_allocator([]))
    pair.run(tamper=corrupt_first(CHUNK, times=2))
    [result] = pair.results
    assert result.ok and result.stats.checksum_failures == 2
    # only the verified resend of each chunk was kept: one piece per chunk, bit-exact
    assert result.kv.num_pieces == pair.sender.encoder.num_chunks
    assert result.kv.to_numpy().tobytes() == kv.tobytes()


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_a_quantized_transfer_into_pieces_fails_closed(make_pair, kv, mode):
    pair = make_pair(kv, mode=mode, allocate=lambda *args: RawPieces(KVInfo(kv.shape, "float32")))
    pair.run()
    [result] = pair.results
    assert not result.ok and result.kv is None and "raw pieces" in result.reason
    assert pair.released == ["t1"] and pair.sender.state is SendState.FAILED


def test_keep_refuses_a_payload_of_the_wrong_length():
    pieces = RawPieces(KVInfo((1, 2, 1, 4, 8), "float32"))
    with pytest.raises(KVValueError, match="holds 64 bytes"):
        pieces.keep(ChunkSpec(0, 0, 2, 0, 4), np.zeros(64, np.uint8))
    assert pieces.num_pieces == 0


def test_copy_into_refuses_a_destination_of_another_shape_or_dtype():
    pieces = RawPieces(KVInfo((1, 2, 1, 4, 8), "float32"))
    with pytest.raises(KVValueError, match="is not a"):
        pieces.copy_into(np.zeros((1, 2, 1, 5, 8), np.float32))
    with pytest.raises(KVValueError, match="is not a"):
        pieces.copy_into(np.zeros((1, 2, 1, 4, 8), np.float16))


def test_release_lets_go_of_the_frames():
    info = KVInfo((1, 2, 1, 4, 8), "float32")
    pieces = RawPieces(info)
    pieces.keep(ChunkSpec(0, 0, 2, 0, 4), np.ones(info.nbytes, np.uint8))
    assert pieces.num_pieces == 1
    pieces.release()
    assert pieces.num_pieces == 0 and list(pieces.pieces()) == []


# ---- corruption of a raw chunk is always detected, and nothing of it is kept ----

RAW_FRAMES = [bytes(f) for f in encode_message(*encoded_chunk("raw", "none", index=1))]


def keep_raw(frames) -> RawPieces:
    """What a decode node's receiver does with a raw chunk: parse, verify, keep."""
    message, payload = decode_message(frames)
    pieces = RawPieces(message.info)
    try:
        verify_and_decode(message, payload, NumpyQuantizer(), pieces)
    except KVError:
        assert pieces.num_pieces == 0   # bad KV is never kept
        raise
    return pieces


def test_an_untouched_raw_chunk_is_kept_as_sent():
    pieces = keep_raw(RAW_FRAMES)
    [(spec, values)] = list(pieces.pieces())
    assert values.tobytes() == KV.reshape(-1, *KV.shape[3:])[spec.planes, spec.tokens].tobytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_bit_flip_or_cut_of_a_raw_chunk_is_detected(data):
    frames = [bytearray(f) for f in RAW_FRAMES]
    which = data.draw(st.integers(0, len(frames) - 1))
    if data.draw(st.booleans()):
        for position, bit in data.draw(st.lists(st.tuples(st.integers(0, len(frames[which]) - 1), st.integers(0, 7)),
                                                min_size=1, max_size=4, unique=True)):
            frames[which][position] ^= 1 << bit
    else:
        del frames[which][data.draw(st.integers(0, len(frames[which]) - 1)):]
    if [bytes(f) for f in frames] == RAW_FRAMES:
        return  # flips cancelled out
    with pytest.raises(KVError):
        keep_raw([bytes(f) for f in frames])
