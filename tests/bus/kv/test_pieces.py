"""RawPieces: a raw transfer kept as its verified frames, through the sans-I/O pair and on its own."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv import RawPieces
from bus.kv.errors import KVValueError
from bus.kv.frames import CHUNK
from bus.kv.layout import ChunkSpec, KVInfo, f32_to_bf16_bits
from bus.kv.send_core import SendState
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
