"""bus.codec: every message round-trips; malformed, truncated and wrong-version input is refused
with a ProtocolError carrying the drop reason (and the request id when it is known)."""

from __future__ import annotations

import pytest

from bus import codec
from bus import constants as c
from bus.codec import ProtocolError
from bus.constants import Command
from bus.messages import (
    Cancel,
    CapacityUpdate,
    Direct,
    Disconnect,
    Error,
    Final,
    Heartbeat,
    Partial,
    Ready,
    Request,
)

MESSAGES = [
    Ready("decode", "d1", {"kv_blocks_total": 100, "kv_blocks_free": 50.5}, "tcp://h:1", ("a",), ("b",)),
    Heartbeat(),
    Disconnect("shutdown", "bye"),
    CapacityUpdate({"queued_tokens": 7}),
    Request("decode", "r1", {"prompt": [1, 2]}, (b"raw",), "gw", "session-9"),
    Partial("r1", 3, {"token": 5}, (b"kv", b"more")),
    Final("r1", 4, None),
    Error("r1", "node_lost", "gone", {"node_id": "d1"}),
    Direct("d2", {"hello": 1}, (b"x",)),
    Cancel("r1", "client"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message):
    frames = codec.encode(message)
    decoded = codec.decode([bytes(f) for f in frames])
    payload = tuple(bytes(p) for p in getattr(decoded, "payload", ()))
    if hasattr(message, "payload"):
        assert payload == message.payload
        assert decoded == type(decoded)(**{**_fields(decoded), "payload": message.payload})
    else:
        assert decoded == message


def _fields(message):
    return {name: getattr(message, name) for name in message.__slots__}


def test_header_is_signature_version_command():
    assert codec.encode(Heartbeat())[0] == b"PDB" + bytes([c.VERSION, Command.HEARTBEAT])
    assert len(codec.HEADERS[Command.READY]) == c.HEADER_SIZE


def test_payload_frames_pass_through_untouched():
    buffer = memoryview(bytearray(1024))
    frames = codec.encode(Partial("r", 0, None, (buffer,)))
    assert frames[-1] is buffer


@pytest.mark.parametrize("header, reason", [
    (b"XYZ\x01\x02", c.DropReason.MALFORMED),
    (b"PDB\x02", c.DropReason.MALFORMED),
    (b"PDB\x09\x02", c.DropReason.BAD_VERSION),
    (b"PDB" + bytes((c.VERSION, 0x7F)), c.DropReason.MALFORMED),
])
def test_bad_headers_are_refused(header, reason):
    with pytest.raises(ProtocolError) as info:
        codec.decode([header])
    assert info.value.reason == reason


def test_empty_message_is_malformed():
    with pytest.raises(ProtocolError):
        codec.decode([])


@pytest.mark.parametrize("message", [m for m in MESSAGES if not isinstance(m, Heartbeat)],
                         ids=lambda m: type(m).__name__)
def test_truncated_messages_are_refused(message):
    frames = [bytes(f) for f in codec.encode(message)]
    with pytest.raises(ProtocolError):
        codec.decode(frames[:codec.MIN_FRAMES[codec.parse_header(frames[0])] - 1])


def test_extra_frames_refused_on_commands_without_payload():
    with pytest.raises(ProtocolError):
        codec.decode([*codec.encode(Heartbeat()), b"extra"])


def test_bad_body_in_a_request_carries_the_request_id():
    frames = codec.encode(Request("decode", "r7", None))
    frames[5] = b"\xc1"   # never valid msgpack
    with pytest.raises(ProtocolError) as info:
        codec.decode(frames)
    assert info.value.request_id == "r7"


@pytest.mark.parametrize("body", [
    {"role": "cook", "node_id": "x"},
    {"role": "decode", "node_id": ""},
    {"role": "decode", "node_id": "x", "capacity": {"a": "lots"}},
    {"role": "decode", "node_id": "x", "capacity": {"a": True}},
    {"role": "decode", "node_id": "x", "inflight": [1, 2]},
    [1, 2, 3],
])
def test_invalid_ready_bodies_are_refused(body):
    with pytest.raises(ProtocolError):
        codec.decode([codec.HEADERS[Command.READY], codec.pack(body)])


def test_bad_seq_and_ids_are_refused():
    header = codec.HEADERS[Command.PARTIAL]
    with pytest.raises(ProtocolError):
        codec.decode([header, b"r1", b"\x00" * 4, codec.pack(None)])
    with pytest.raises(ProtocolError):
        codec.decode([header, b"\xff\xfe", codec.encode_seq(0), codec.pack(None)])
    with pytest.raises(ProtocolError):
        codec.decode([header, b"r" * (c.MAX_ID_BYTES + 1), codec.encode_seq(0), codec.pack(None)])
