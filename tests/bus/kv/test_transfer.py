"""The sans-I/O sender and receiver together, through an in-memory network and a fake clock."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv.frames import ACK, CHUNK, DONE, END, NACK, Abort, Done, decode_message, encode_message
from bus.kv.kv_errors import KVValueError
from bus.kv.recv_core import ReceiveConfig
from bus.kv.send_core import SendConfig, SendState
from tests.bus.kv.conftest import PEER, synthetic_kv


def kind(frames) -> int:
    return bytes(memoryview(frames[0])[5:6])[0]


@pytest.mark.parametrize("mode", ["raw", "bf16", "int8", "int8_sym"])
@pytest.mark.parametrize("compression", ["none", "lz4", "auto"])
def test_a_clean_transfer_completes_on_both_sides(make_pair, kv, mode, compression):
    pair = make_pair(kv, mode=mode, compression=compression)
    pair.run()
    assert pair.sender.state is SendState.DONE
    [result] = pair.results
    assert result.ok and result.transfer_id == "t1" and result.request_id == "r1"
    assert result.stats.num_chunks == pair.sender.encoder.num_chunks > 3
    assert result.stats.checksum_failures == result.stats.rejected == 0
    if mode == "raw":
        assert result.kv.tobytes() == kv.tobytes()
    else:
        assert np.abs(result.kv - kv).max() < 0.1


def test_credits_bound_the_chunks_in_flight(make_pair, kv):
    pair = make_pair(kv, window=2)
    pair.pump_sender()
    assert len(pair.wire) == 2                       # two credits, no reply yet: the sender waits
    assert pair.sender.next_frames(pair.clock()) is None
    pair.deliver_to_receiver()
    pair.deliver_to_sender()                         # two ACKs return two credits
    pair.pump_sender()
    assert len(pair.wire) == 2
    pair.run()
    assert pair.max_in_flight <= 2 and pair.results[0].ok


def corrupt_first(kind_wanted: int, times: int = 1):
    state = {"left": times}

    def tamper(frames):
        if kind(frames) == kind_wanted and state["left"]:
            state["left"] -= 1
            frames = [bytes(memoryview(f).cast("B")) for f in frames]
            last = bytearray(frames[-1])
            last[len(last) // 2] ^= 0x10
            frames[-1] = bytes(last)
        return frames
    return tamper


def test_a_corrupt_chunk_is_nacked_resent_and_counted(make_pair, kv):
    pair = make_pair(kv)
    pair.run(tamper=corrupt_first(CHUNK, times=2))
    [result] = pair.results
    assert result.ok and result.stats.checksum_failures == 2 and result.stats.nacks == 2
    assert pair.sender.stats.resends == 2 and pair.sender.stats.checksum_failures == 2
    assert np.abs(result.kv - kv).max() < 0.1


def test_after_the_bound_the_transfer_fails_closed(make_pair, kv):
    pair = make_pair(kv, receive_config=ReceiveConfig(max_nacks_per_chunk=2))
    pair.run(tamper=corrupt_first(CHUNK, times=100))
    [result] = pair.results
    assert not result.ok and result.kv is None and "rejected 3 times" in result.reason
    assert pair.sender.state is SendState.FAILED and pair.released == ["t1"]


def test_the_sender_bounds_its_resends_too(make_pair, kv):
    pair = make_pair(kv, send_config=SendConfig(window=3, max_attempts=2, ack_timeout=0.5),
                     receive_config=ReceiveConfig(max_nacks_per_chunk=50))
    pair.run(tamper=corrupt_first(CHUNK, times=100))
    assert pair.sender.state is SendState.FAILED and "not accepted after 2 attempts" in pair.sender.reason


def drop(kind_wanted: int, times: int = 1, index=None):
    state = {"left": times}

    def tamper(frames):
        wanted = kind(frames) == kind_wanted and state["left"]
        if wanted and (index is None or decode_message(frames)[0].index == index):
            state["left"] -= 1
            return None
        return frames
    return tamper


def test_a_missing_chunk_is_nacked_when_end_arrives(make_pair, kv):
    pair = make_pair(kv)
    pair.run(tamper=drop(CHUNK, index=4))
    [result] = pair.results
    assert result.ok and result.stats.nacks == 1


def test_a_dropped_chunk_is_resent_after_the_ack_timeout(make_pair, kv):
    pair = make_pair(kv, window=1)
    pair.run(tamper=drop(CHUNK, index=0), advance=0.3)
    assert pair.results[0].ok and pair.sender.stats.resends >= 1


def test_a_dropped_end_is_resent_after_the_ack_timeout(make_pair, kv):
    pair = make_pair(kv)
    pair.run(tamper=drop(END), advance=0.3)
    assert pair.results[0].ok and pair.sender.state is SendState.DONE


def test_a_dropped_done_is_answered_again_for_a_late_end(make_pair, kv):
    pair = make_pair(kv)
    lost = {"done": 0}
    pair.pump_sender()
    for _ in range(100):
        pair.pump_sender()
        pair.deliver_to_receiver()
        replies = []
        for r in pair.replies:
            if kind(r) == DONE and not lost["done"]:
                lost["done"] += 1
                continue
            replies.append(r)
        pair.replies = replies
        pair.deliver_to_sender()
        pair.clock.advance(0.3)
        pair.sender.poll(pair.clock())
        if pair.sender.finished:
            break
    assert lost["done"] == 1 and pair.sender.state is SendState.DONE and len(pair.results) == 1


def test_duplicates_are_counted_and_acknowledged_not_applied_twice(make_pair, kv):
    pair = make_pair(kv)

    def duplicate(frames):
        if kind(frames) == CHUNK and decode_message(frames)[0].index == 2:
            pair.receiver.on_frames(PEER, [bytes(memoryview(f).cast("B")) for f in frames], pair.clock())
        return frames
    pair.run(tamper=duplicate)
    [result] = pair.results
    assert result.ok and result.stats.duplicates == 1


def test_a_mismatched_header_is_rejected_and_nacked(make_pair, kv):
    pair = make_pair(kv)
    first = {"seen": False}

    def mismatch(frames):
        message, payload = decode_message(frames)
        if kind(frames) == CHUNK and message.index == 1 and not first["seen"]:
            first["seen"] = True
            from dataclasses import replace
            return encode_message(replace(message, request_id="someone-else"), payload)
        return frames
    pair.run(tamper=mismatch)
    [result] = pair.results
    assert result.ok and result.stats.rejected == 1 and result.stats.nacks == 1


def test_chunks_from_another_peer_are_rejected(make_pair, kv):
    pair = make_pair(kv)
    pair.pump_sender()
    first = pair.wire.pop(0)
    pair.deliver_to_receiver()
    replies = pair.receiver.on_frames(b"intruder", [bytes(memoryview(f).cast("B")) for f in first], pair.clock())
    assert [kind(frames) for _, frames in replies] == [NACK]


def test_overlapping_chunks_are_rejected():
    from bus.kv.chunk_codec import ChunkEncoder
    from bus.kv.quant import NumpyQuantizer
    from bus.kv.recv_core import ReceiverCore
    kv = synthetic_kv()
    small = ChunkEncoder(kv, NumpyQuantizer(), transfer_id="t", request_id="r", mode="raw", compression="none",
                         chunk_bytes=2048)
    outs = [np.empty(n, np.uint8) for n in small.buffer_sizes()]
    receiver = ReceiverCore(NumpyQuantizer(), lambda *a: np.zeros(kv.shape, np.float32))
    header, wire = small.encode(0, outs)
    assert kind(receiver.on_frames(PEER, encode_message(header, wire), 0.0)[0][1]) == ACK
    from dataclasses import replace
    overlapping = replace(header, index=1)
    [(_, reply)] = receiver.on_frames(PEER, encode_message(overlapping, wire), 0.0)
    assert kind(reply) == NACK


def test_a_receiver_timeout_fails_closed_and_tells_the_sender(make_pair, kv):
    pair = make_pair(kv, window=2)
    pair.pump_sender()
    pair.deliver_to_receiver()
    pair.clock.advance(6.0)
    replies = pair.receiver.poll(pair.clock())
    [result] = pair.receiver.pop_results()
    assert not result.ok and "timed out" in result.reason and pair.released == ["t1"]
    assert isinstance(decode_message(replies[0][1])[0], Done)


def test_a_sender_timeout_is_reported(make_pair, kv):
    pair = make_pair(kv, send_config=SendConfig(transfer_timeout=1.0, ack_timeout=0.5))
    pair.pump_sender()
    pair.clock.advance(1.5)
    pair.sender.poll(pair.clock())
    assert pair.sender.state is SendState.FAILED and pair.sender.timed_out


def test_no_destination_refuses_the_transfer(make_pair, kv):
    pair = make_pair(kv, allocate=lambda *args: None)
    pair.run()
    assert pair.sender.state is SendState.FAILED and "no destination" in pair.sender.reason
    assert not pair.results[0].ok


def test_an_allocator_that_raises_refuses_too_and_both_sides_are_told_why(make_pair, kv):
    def broken(*args):
        raise MemoryError("engine full")
    pair = make_pair(kv, allocate=broken)
    pair.run()
    assert pair.sender.state is SendState.FAILED and "allocator failed: MemoryError: engine full" in pair.sender.reason
    assert not pair.results[0].ok and pair.results[0].reason == "the allocator failed: MemoryError: engine full"


def test_an_abort_frees_the_receivers_buffer(make_pair, kv):
    pair = make_pair(kv, window=2)
    pair.pump_sender()
    pair.deliver_to_receiver()
    abort = pair.sender.abort("client disconnected", pair.clock())
    assert pair.receiver.on_frames(PEER, abort, pair.clock()) == []
    [result] = pair.receiver.pop_results()
    assert not result.ok and "client disconnected" in result.reason and pair.released == ["t1"]
    assert pair.sender.state is SendState.FAILED and pair.receiver.num_active == 0


def test_a_local_cancel_frees_the_buffer_and_tells_the_sender(make_pair, kv):
    pair = make_pair(kv, window=2)
    pair.pump_sender()
    pair.deliver_to_receiver()
    replies = pair.receiver.cancel("t1", pair.clock(), "request aborted")
    assert pair.released == ["t1"] and kind(replies[0][1]) == DONE
    assert pair.receiver.cancel("t1", pair.clock()) == []        # idempotent


def test_a_bad_digest_fails_closed(make_pair, kv):
    pair = make_pair(kv)

    def lie(frames):
        message, _ = decode_message(frames)
        if kind(frames) == END:
            from dataclasses import replace
            return encode_message(replace(message, digest=(message.digest + 1) % 2**64))
        return frames
    pair.run(tamper=lie)
    assert not pair.results[0].ok and "digest" in pair.results[0].reason


def test_a_mismatched_end_fails_closed(make_pair, kv):
    pair = make_pair(kv)

    def lie(frames):
        message, _ = decode_message(frames)
        if kind(frames) == END:
            from dataclasses import replace
            return encode_message(replace(message, raw_bytes=message.raw_bytes + 4))
        return frames
    pair.run(tamper=lie)
    assert not pair.results[0].ok and "END does not match" in pair.results[0].reason


def test_undecodable_messages_are_counted_and_dropped(make_pair, kv):
    pair = make_pair(kv)
    assert pair.receiver.on_frames(PEER, [b"garbage"], 0.0) == []
    assert pair.receiver.on_frames(PEER, encode_message(Abort("unknown", "x")), 0.0) == []
    assert pair.receiver.undecodable == 1


def test_the_sender_ignores_replies_for_other_transfers(make_pair, kv):
    pair = make_pair(kv)
    pair.sender.on_message(Done("other", True, "", 0, 0), 0.0)
    assert pair.sender.state is SendState.SENDING


def test_bad_modes_are_refused_before_anything_is_sent(make_pair, kv):
    with pytest.raises(KVValueError):
        make_pair(kv, mode="int4")
    with pytest.raises(KVValueError):
        make_pair(kv, compression="brotli")
