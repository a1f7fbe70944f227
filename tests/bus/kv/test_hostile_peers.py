"""A hostile or buggy peer against the sans-I/O cores: the receiver core and the sender's reply
handling never raise, never allocate in proportion to a claim, and a well-behaved transfer
afterwards still completes."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.kv.frames import (
    ABORT,
    ACK,
    CHUNK,
    DONE,
    END,
    NACK,
    Ack,
    Done,
    End,
    Nack,
    decode_message,
    encode_message,
)
from bus.kv.recv_core import ReceiveConfig
from bus.kv.send_core import SendState
from bus.kv.sender import KVSender
from tests.bus.kv.conftest import PEER, Pair, seal, synthetic_kv
from tests.bus.kv.test_hostile_headers import BASES, FIELD, values
from tests.conftest import FakeClock

GOOD = "well-behaved"
KV = synthetic_kv()
SMALL = ReceiveConfig(transfer_timeout=5.0, max_transfer_bytes=1 << 20)
properties = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def hostile_chunk(mode: str, mutations: list) -> list:
    fields, payload = BASES[mode]
    fields = [list(f) if isinstance(f, list) else f for f in fields]
    fields[FIELD["transfer_id"]] = "hostile"
    for where, value in mutations:
        fields[where] = value
    return [seal(CHUNK, fields), *payload]


chunks = st.builds(hostile_chunk, st.sampled_from(sorted(BASES)),
                   st.lists(st.tuples(st.integers(1, 15), values), max_size=3))
controls = st.builds(lambda kind, fields: [seal(kind, fields)], st.sampled_from([END, ABORT, ACK, NACK, DONE]),
                     st.lists(values, max_size=6))
ends = st.builds(lambda count, raw, digest: [seal(END, ["hostile", "r1", count, raw, digest])],
                 st.integers(-1, 2**31), st.integers(-1, 2**50), st.integers(0, 2**64 - 1))
garbage = st.lists(st.binary(max_size=64), min_size=1, max_size=4)
messages = st.tuples(st.sampled_from([PEER, b"intruder"]), st.one_of(chunks, controls, ends, garbage))


@properties
@given(st.lists(messages, max_size=30))
def test_random_and_mutated_messages_never_break_the_receiver_core(messages):
    pair = Pair(KV, FakeClock(), transfer_id=GOOD, receive_config=SMALL)
    for peer, frames in messages:
        for reply_peer, reply in pair.receiver.on_frames(peer, frames, pair.clock()):
            assert reply_peer == peer
            decode_message(reply)          # every reply is well formed
        pair.receiver.poll(pair.clock())
        pair.receiver.pop_results()
    pair.run()
    [result] = [r for r in pair.receiver.pop_results() + pair.results if r.transfer_id == GOOD]
    assert result.ok and pair.sender.state is SendState.DONE


def test_a_transfer_beyond_max_transfer_bytes_is_refused_before_allocating(make_pair, kv):
    pair = make_pair(kv, receive_config=ReceiveConfig(max_transfer_bytes=kv.nbytes - 1))
    pair.run()
    assert pair.allocate_calls == 0 and pair.sender.state is SendState.FAILED
    assert "too large" in pair.sender.reason and not pair.results[0].ok


def test_a_chunk_beyond_max_chunk_bytes_is_refused_before_allocating(make_pair, kv):
    pair = make_pair(kv, chunk_bytes=4096, receive_config=ReceiveConfig(max_chunk_bytes=1024))
    pair.run()
    assert pair.sender.state is SendState.FAILED and "max_chunk_bytes" in pair.sender.reason
    assert not pair.results[0].ok and pair.allocate_calls == 0


def test_an_end_nacks_a_bounded_number_of_missing_chunks_and_the_transfer_still_completes(make_pair):
    kv = synthetic_kv(layers=8, heads=2, tokens=16, head_dim=16)
    pair = make_pair(kv, mode="raw", chunk_bytes=1024, window=40,
                     receive_config=ReceiveConfig(transfer_timeout=30.0, max_nacks_per_end=3))
    pair.pump_sender()                       # every chunk, then END
    assert len(pair.wire) > 5 and isinstance(decode_message(pair.wire[-1])[0], End)
    pair.wire = [pair.wire[0], pair.wire[-1]]   # all but the first chunk lost
    pair.deliver_to_receiver()
    assert [type(decode_message(r)[0]) for r in pair.replies] == [Ack, Nack, Nack, Nack]
    pair.run(advance=0.3, steps=400)
    assert pair.results[0].ok


def test_a_chunk_from_another_peer_is_answered_to_it_and_spends_nothing_of_the_owners(make_pair, kv):
    """An intruder that learned a transfer id could fail it with a few chunks: their NACKs went to
    the owner and counted against the owner's max_nacks_per_chunk."""
    pair = make_pair(kv, receive_config=ReceiveConfig(transfer_timeout=5.0, max_nacks_per_chunk=1))
    pair.pump_sender()
    first = [bytes(memoryview(f).cast("B")) for f in pair.wire[0]]
    pair.deliver_to_receiver()
    for _ in range(5):
        [(to, reply)] = pair.receiver.on_frames(b"intruder", first, pair.clock())
        assert to == b"intruder" and isinstance(decode_message(reply)[0], Nack)
    pair.run()
    assert pair.results[0].ok and pair.results[0].stats.rejected == 5


# ---- the sender: a hostile or buggy receiver's replies ----

def replies_for(transfer_id: str):
    ids = st.sampled_from([transfer_id, "other"])
    indices = st.integers(-1, 2**31 - 1) | st.integers(-1, 8)
    good = st.one_of(st.builds(lambda t, i: encode_message(Ack(t, i)), ids, indices.filter(lambda i: i >= 0)),
                     st.builds(lambda t, i: encode_message(Nack(t, i, "x")), ids, indices))
    mutated = st.builds(lambda kind, fields: [seal(kind, fields)], st.sampled_from([ACK, NACK, DONE, CHUNK, END]),
                        st.lists(values | ids, max_size=6))
    return st.lists(good | mutated | st.lists(st.binary(max_size=32), min_size=1, max_size=3), max_size=40)


@properties
@given(replies_for("t1"))
def test_hostile_replies_never_break_the_senders_reader_or_grow_its_state(replies):
    pair, sender = Pair(KV, FakeClock(), window=3), KVSender()
    wakeups = SimpleNamespace(set=lambda: None)
    connection = SimpleNamespace(transfers={"t1": (pair.sender, wakeups)})
    pair.pump_sender()
    for frames in replies:
        sender._on_reply(connection, frames, pair.clock())
        pair.pump_sender()
        assert len(pair.sender._in_flight) <= 3 and len(pair.sender._resend) <= 3
        assert pair.sender.stats.resends <= pair.sender.encoder.num_chunks * 4 + 4
    pair.wire.clear()
    if not pair.sender.finished:
        pair.run(advance=0.3, steps=400)
        assert pair.sender.finished


@properties
@given(replies_for("someone-else"))
def test_replies_for_other_transfers_leave_a_transfer_to_complete(replies):
    pair = Pair(KV, FakeClock())
    connection = SimpleNamespace(transfers={"t1": (pair.sender, SimpleNamespace(set=lambda: None))})
    pair.pump_sender()
    for frames in replies:
        KVSender()._on_reply(connection, frames, pair.clock())
    pair.run()
    assert pair.sender.state is SendState.DONE and pair.results[0].ok


def test_out_of_range_acks_nacks_and_an_end_nack_before_any_end_are_harmless(make_pair, kv):
    pair = make_pair(kv, window=2)
    pair.pump_sender()
    sender = pair.sender
    for message in (Ack("t1", 2**31 - 1), Ack("t1", 50), Nack("t1", 2**31 - 1, "x"), Nack("t1", -1, "no END yet"),
                    Done("unknown", True, "", 0, 0), Ack("t1", 1), Ack("t1", 1)):
        sender.on_message(message, pair.clock())
    assert sender.state is SendState.SENDING and sorted(sender._in_flight) == [0]
    pair.pump_sender()                                   # the credit of chunk 1 came back, once
    assert sorted(sender._in_flight) == [0, 2] and not sender._resend
    pair.wire.clear()
    pair.run(advance=0.3, steps=400)
    assert sender.finished                               # chunk 1 never arrived: it fails closed, bounded
