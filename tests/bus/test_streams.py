"""STREAMS, the batched token plane (docs/PROTOCOL.md §1.2): codec bounds, the broker's fast path
(forwarded whole, zero copy) and its split path (gone routes, several clients, a client not back
after a restart), and the endpoint's `reply_batch` (one message per client, sequence numbers
shared with `reply`, delivery as ordinary PARTIALs)."""

from __future__ import annotations

import contextlib
import random

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import codec
from bus import constants as c
from bus.broker_core import BrokerCore
from bus.codec import ProtocolError
from bus.constants import Command
from bus.endpoint_core import EndpointCore
from bus.liveness import HeartbeatConfig
from bus.messages import Disconnect, Error, Final, Heartbeat, Partial, Request, Streams
from tests.bus.broker_helpers import BrokerDriver

HB = HeartbeatConfig(interval_s=0.25, liveness=3)
W, G, G2 = b"worker", b"gateway", b"gateway2"


def streams(*entries: tuple[str, int]) -> Streams:
    return Streams(tuple(Partial(request_id, seq, {"t": seq}) for request_id, seq in entries))


# -- codec ----------------------------------------------------------------------------------

def test_streams_round_trip():
    message = Streams((Partial("a", 0, {"x": 1}), Partial("b", 7, [1, 2]), Partial("a", 1, None)))
    frames = codec.encode(message)
    assert frames[0] == codec.HEADERS[Command.STREAMS] and len(frames) == 3
    assert codec.decode(frames) == message


def test_bodies_must_match_the_index_and_ids_be_utf8():
    index = codec.pack([b"a", 0, b"b", 1])
    for bodies in ([1], [1, 2, 3], {"a": 1}, 5):
        with pytest.raises(ProtocolError):
            codec.decode([codec.HEADERS[Command.STREAMS], index, codec.pack(bodies)])
    with pytest.raises(ProtocolError):
        codec.decode([codec.HEADERS[Command.STREAMS], codec.pack([b"\xff", 0]), codec.pack([1])])


def test_entries_carry_no_payload_and_at_least_one():
    with pytest.raises(ProtocolError):
        codec.encode(Streams((Partial("a", 0, None, (b"kv",)), Partial("b", 0))))
    with pytest.raises(ProtocolError):
        codec.encode(Streams(()))


@given(st.binary(max_size=200), st.binary(max_size=200))
def test_random_frames_decode_or_are_refused(index, bodies):
    with contextlib.suppress(ProtocolError):   # never any other exception
        codec.decode([codec.HEADERS[Command.STREAMS], index, bodies])


# -- broker -----------------------------------------------------------------------------------

@pytest.fixture
def pair(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(W, "decode", "d1")
    broker.register(G, "gateway", "g1")
    broker.register(G2, "gateway", "g2")
    for request_id in ("r1", "r2", "r3"):
        broker.send(G, Request("decode", request_id))
    broker.send(G2, Request("decode", "other"))
    broker.outgoing()
    return broker


def test_a_batch_for_one_client_is_forwarded_whole(pair):
    frames = codec.encode(streams(("r1", 0), ("r2", 0), ("r3", 0), ("r1", 1)))
    pair.send_raw(W, frames)
    (out,) = pair.core.take_outbox()
    assert out[0] == G and all(a is b for a, b in zip(out[1:], frames, strict=True))
    assert pair.core.routes[b"r1"].num_replies == 2 and pair.core.routes[b"r3"].num_replies == 1
    assert pair.core.metrics["routed.streams"] == 1 and pair.core.metrics["routed.stream_entries"] == 4


def test_a_batch_with_a_finished_request_is_split_and_the_rest_delivered(pair):
    pair.send(W, Final("r2", 0))
    pair.outgoing()
    pair.send(W, streams(("r1", 0), ("r2", 1), ("r3", 0)))
    out = pair.outgoing()
    assert [(dest, m.request_id) for dest, m in out] == [(G, "r1"), (G, "r3")]
    assert all(isinstance(m, Partial) and m.body == {"t": 0} for _, m in out)
    assert pair.core.metrics["streams.split"] == 1 and pair.core.metrics["dropped.unknown_request"] == 1


def test_a_batch_for_two_clients_reaches_each(pair):
    pair.send(W, streams(("r1", 0), ("other", 0)))
    assert sorted((dest, m.request_id) for dest, m in pair.outgoing()) == [(G, "r1"), (G2, "other")]


def test_only_the_serving_node_may_send_a_batch(pair, clock):
    pair.register(b"intruder", "decode", "d9")
    pair.outgoing()
    pair.send(b"intruder", streams(("r1", 5), ("r2", 5)))
    assert pair.outgoing() == [] and pair.core.metrics["dropped.unknown_request"] == 2


def test_an_unreadable_index_disconnects_its_sender_only(pair):
    pair.send_raw(W, [codec.HEADERS[Command.STREAMS], b"\xc1", codec.pack([1])])
    out = pair.outgoing()
    assert (W, Disconnect(c.DropReason.MALFORMED, out[0][1].detail)) in out
    assert "d1" not in pair.core.nodes_by_id and "g1" in pair.core.nodes_by_id
    lost = [m for dest, m in out if dest == G and isinstance(m, Error)]
    assert sorted(m.request_id for m in lost) == ["r1", "r2", "r3"]   # their streams end, not hang


def test_unreadable_bodies_on_the_split_path_disconnect_the_sender(pair):
    pair.send_raw(W, [codec.HEADERS[Command.STREAMS], codec.pack([b"r1", 0, b"other", 0]), b"\xc1"])
    assert "d1" not in pair.core.nodes_by_id


def test_after_a_restart_a_batch_waits_for_its_client(clock):
    broker = BrokerDriver(BrokerCore(HB), clock)
    broker.register(W, "decode", "d1", inflight=("r1", "r2"))
    broker.outgoing()
    broker.send(W, streams(("r1", 4), ("r2", 9)))
    assert broker.outgoing() == [] and broker.core.metrics["held.reply"] == 2
    broker.register(G, "gateway", "g1", pending=("r1", "r2"))
    held = [m for m in broker.to(G) if isinstance(m, Partial)]
    assert [(m.request_id, m.seq) for m in held] == [("r1", 4), ("r2", 9)]


# -- endpoint -----------------------------------------------------------------------------

@pytest.fixture
def up(clock):
    core = EndpointCore("decode", "d1", {}, "", HB, random.Random(1))
    core.on_socket_opened(clock.now)
    core.on_frames(codec.encode(Heartbeat()), clock.now)
    for request_id, client in (("a", "g1"), ("b", "g1"), ("c", "g2")):
        core.on_frames(codec.encode(Request("decode", request_id, None, (), client)), clock.now)
    core.take_outbox()
    core.take_events()
    return core


def sent(core: EndpointCore) -> list:
    return [codec.decode([bytes(f) for f in frames]) for frames in core.take_outbox()]


def test_reply_batch_sends_one_message_per_client(up, clock):
    up.reply("a", "first", (), False, clock.now)
    up.reply_batch([("a", 1), ("b", 2), ("c", 3), ("gone", 4)], clock.now)
    up.reply("a", None, (), True, clock.now)
    out = sent(up)
    assert out[0] == Partial("a", 0, "first")
    assert out[1] == Streams((Partial("a", 1, 1), Partial("b", 0, 2)))
    assert out[2] == Partial("c", 0, 3)   # alone for its client: a plain PARTIAL
    assert out[3] == Final("a", 2, None)
    assert up.metrics["dropped.reply_to_unknown_request"] == 1 and up.metrics["sent.streams"] == 1


def test_an_unencodable_body_fails_only_its_request(up, clock):
    up.reply_batch([("a", 1), ("b", object()), ("c", 2)], clock.now)
    out = sent(up)
    assert Partial("a", 0, 1) in out and Partial("c", 0, 2) in out
    assert [m.request_id for m in out if isinstance(m, Error)] == ["b"]
    assert "b" not in up.serving


def test_a_batch_is_replayed_after_a_broker_loss(up, clock):
    up.reply_batch([("a", 1), ("b", 2)], clock.now)
    up.take_outbox()
    clock.advance(HB.expiry_s + 0.01)
    assert up.tick(clock.now)   # the broker went silent: new socket
    up.on_socket_opened(clock.now)
    ready = sent(up)[0]
    assert set(ready.inflight) == {"a", "b", "c"}
    up.on_frames(codec.encode(Heartbeat()), clock.now)
    assert Streams((Partial("a", 0, 1), Partial("b", 0, 2))) in sent(up)


def test_a_client_receives_a_batch_as_partials_with_the_usual_checks(clock):
    client = EndpointCore("gateway", "g1", {}, "", HB, random.Random(1))
    client.on_socket_opened(clock.now)
    client.on_frames(codec.encode(Heartbeat()), clock.now)
    for request_id in ("a", "b"):
        client.request(Request("decode", request_id), clock.now)
    client.take_events()
    for message in (streams(("a", 0), ("b", 0)), streams(("a", 0), ("b", 1), ("zzz", 0))):
        client.on_frames(codec.encode(message), clock.now)
    assert [(e.request_id, e.seq) for e in client.take_events()] == [("a", 0), ("b", 0), ("b", 1)]
    assert client.metrics["dropped.duplicate"] == 1 and client.metrics["dropped.unknown_request"] == 1


def test_ids_of_another_type_take_the_split_path_and_disconnect_the_sender(pair):
    pair.send_raw(W, [codec.HEADERS[Command.STREAMS], msgpack.packb(["r1", 0, "r2", 0]), codec.pack([1, 2])])
    assert "d1" not in pair.core.nodes_by_id and pair.core.metrics["dropped.malformed"] == 1


def test_a_bad_seq_from_the_serving_node_reaches_only_its_client_which_drops_it(pair, clock):
    frames = [codec.HEADERS[Command.STREAMS], msgpack.packb([b"r1", -1, b"r2", 0]), codec.pack([1, 2])]
    pair.send_raw(W, frames)   # routed as is: the broker reads ids, not seqs (the node harms its own streams)
    (out,) = pair.core.take_outbox()
    client = EndpointCore("gateway", "g1", {}, "", HB, random.Random(1))
    client.on_socket_opened(clock.now)
    client.on_frames(codec.encode(Heartbeat()), clock.now)
    client.on_frames([bytes(f) for f in out[1:]], clock.now)
    assert client.metrics["dropped.malformed"] == 1
