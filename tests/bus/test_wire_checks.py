"""bus.wire_checks and the codec's body bounds: whatever msgpack value sits in a body frame,
`codec.decode` returns a message within the bounds or raises ProtocolError, never anything else;
`codec.pack` refuses what no peer would accept."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus import codec
from bus import constants as c
from bus import wire_checks as checks
from bus.codec import ProtocolError
from bus.constants import Command

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), st.floats(),
                    st.text(max_size=300), st.binary(max_size=50))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=70), inner, max_size=5)), max_leaves=40)
field_names = st.sampled_from(["role", "node_id", "capacity", "data_endpoint", "inflight", "pending",
                               "reason", "detail", "code", "message", "details", "x"])
bodies = st.one_of(values, st.dictionaries(field_names, values, max_size=8))

_BODY_FRAME = {Command.READY: 1, Command.DISCONNECT: 1, Command.CAPACITY: 1, Command.ERROR: 2,
               Command.CANCEL: 2, Command.DIRECT: 2, Command.PARTIAL: 3, Command.FINAL: 3,
               Command.REQUEST: 5}


def _frames(command: Command, body: bytes) -> list[bytes]:
    frames = [codec.HEADERS[command]] + [b"r1"] * (codec.MIN_FRAMES[command] - 1)
    if command in (Command.PARTIAL, Command.FINAL):
        frames[2] = codec.encode_seq(0)
    frames[_BODY_FRAME[command]] = body
    return frames


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(_BODY_FRAME)), bodies)
def test_any_body_decodes_within_bounds_or_raises_protocol_error(command, body):
    try:
        message = codec.decode(_frames(command, msgpack.packb(body, use_bin_type=True)))
    except ProtocolError:
        return
    for value in (getattr(message, name, None) for name in ("body", "capacity", "details")):
        checks.check_depth(value)
    repr(message)   # a decoded message can always be logged


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_depth_is_checked_iteratively_at_any_depth():
    checks.check_depth(_deep(c.MAX_BODY_DEPTH))
    with pytest.raises(ProtocolError):
        checks.check_depth(_deep(c.MAX_BODY_DEPTH + 1))
    with pytest.raises(ProtocolError):
        checks.check_depth({"a": _deep(100_000)})   # no RecursionError


@pytest.mark.parametrize("value", [2 ** 64, -2 ** 63 - 1, "\ud800", object(), _deep(40), {1j: 1}])
def test_pack_refuses_what_no_peer_accepts(value):
    with pytest.raises(ProtocolError):
        codec.pack(value)


@pytest.mark.parametrize("capacity", [
    {"a": math.nan}, {"a": math.inf}, {"a": True}, {"a": "1"}, {"k" * 65: 1},
    {f"k{i}": 1 for i in range(c.MAX_CAPACITY_KEYS + 1)}, [1, 2],
])
def test_capacity_maps_are_bounded(capacity):
    with pytest.raises(ProtocolError):
        checks.capacity_map(capacity)


def test_announced_ids_are_bounded():
    assert checks.id_list(["a", "b"], "inflight") == ("a", "b")
    for bad in (["a"] * (c.MAX_ANNOUNCED_IDS + 1), [""], ["x" * 129], [1], "ab"):
        with pytest.raises(ProtocolError):
            checks.id_list(bad, "inflight")


def test_long_free_text_is_cut_not_refused():
    error = codec.decode([codec.HEADERS[Command.ERROR], b"r1",
                          codec.pack({"code": "full", "message": "m" * 100_000})])
    assert len(error.message) == c.MAX_TEXT_CHARS + 1 and error.code == "full"
    with pytest.raises(ProtocolError) as info:
        codec.decode([codec.HEADERS[Command.ERROR], b"r1", codec.pack({"code": "c" * 65})])
    assert info.value.request_id == "r1"   # the stream it ends is known
