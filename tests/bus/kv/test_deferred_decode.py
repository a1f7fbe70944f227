"""ReceiverCore with `defer_decode`: ACK once a chunk verified, decode after, complete only then."""

from __future__ import annotations

import numpy as np

from bus.kv.frames import ACK, DONE, Done, decode_message
from bus.kv.kv_errors import KVFrameError
from bus.kv.send_core import SendState
from tests.bus.kv.conftest import PEER


def kind(frames) -> int:
    return bytes(memoryview(frames[0])[5:6])[0]


def deliver_deferred(pair) -> list:
    """Every message on the wire into the receiver with deferred decodes; the replies it gave."""
    wire, pair.wire = pair.wire, []
    replies = []
    for frames in wire:
        replies += [reply for _, reply in pair.receiver.on_frames(
            PEER, [bytes(memoryview(f).cast("B")) for f in frames], pair.clock(), defer_decode=True)]
    return replies


def test_chunks_are_acked_before_they_are_decoded_and_done_waits_for_the_decodes(make_pair, kv):
    pair = make_pair(kv, mode="raw", window=64)
    pair.pump_sender()
    acks = deliver_deferred(pair)
    assert [kind(r) for r in acks] == [ACK] * pair.sender.encoder.num_chunks
    [dst] = [t.dst for t in pair.receiver._transfers.values()]
    assert np.isnan(dst).all()                       # acknowledged, nothing decoded yet
    pair.replies += acks
    pair.deliver_to_sender()
    pair.pump_sender()                               # every chunk acknowledged: END
    assert deliver_deferred(pair) == []              # END before the decodes ran: no DONE yet
    assert pair.receiver.pop_results() == []
    [done] = [reply for _, reply in pair.receiver.run_decodes(pair.clock())]
    assert kind(done) == DONE and decode_message(done)[0].ok
    [result] = pair.receiver.pop_results()
    assert result.ok and result.kv.tobytes() == kv.tobytes()
    pair.replies.append(done)
    pair.deliver_to_sender()
    assert pair.sender.state is SendState.DONE


def test_a_decode_failing_after_its_ack_fails_the_transfer_closed(make_pair, kv):
    pair = make_pair(kv, mode="raw", window=64)
    decode = pair.quantizer.decode
    calls = []

    def failing_decode(payload, info, spec, mode, scale_dtype, dst):
        calls.append(spec)
        if len(calls) == 2:
            raise KVFrameError("destination cannot take this chunk")
        decode(payload, info, spec, mode, scale_dtype, dst)

    pair.quantizer.decode = failing_decode
    pair.pump_sender()
    deliver_deferred(pair)
    replies = [reply for _, reply in pair.receiver.run_decodes(pair.clock())]
    [done] = [decode_message(r)[0] for r in replies]
    assert isinstance(done, Done) and not done.ok and "failed to decode" in done.reason
    [result] = pair.receiver.pop_results()
    assert not result.ok and result.kv is None and pair.released == ["t1"]
    assert len(calls) == 2                           # the rest of the queue was dropped with it


def test_cancel_drops_the_queued_decodes(make_pair, kv):
    pair = make_pair(kv, mode="raw", window=64)
    pair.pump_sender()
    deliver_deferred(pair)
    [dst] = [t.dst for t in pair.receiver._transfers.values()]
    pair.receiver.cancel("t1", pair.clock(), "request aborted")
    assert pair.receiver.run_decodes(pair.clock()) == []
    assert np.isnan(dst).all()                       # nothing written into a released buffer
    [result] = pair.receiver.pop_results()
    assert not result.ok and result.reason == "request aborted"
