"""What the bus can carry, checked where the request is validated (nodes/gateway/schema.py):
strings that are not UTF-8 (lone surrogates), integers beyond 64 bits, non-finite numbers, session
ids the bus cannot route or a header cannot echo, and deep nesting are each a 400 naming the field.
The property: any generated body is either refused with the gateway's own error (which can itself
be sent on a WebSocket) or accepted as a request that `bus.codec.pack` encodes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.codec import pack
from nodes import wire
from nodes.engines.base import SamplingParams
from nodes.gateway.api_errors import ApiError
from nodes.gateway.schema import MAX_DEPTH, MAX_SESSION_ID_CHARS, parse_request

MODEL = "m"
GOOD = {"model": MODEL, "prompt": "hi"}


def parse(body, chat=False, **options):
    return parse_request(body, chat=chat, model_name=MODEL, max_tokens_limit=100, **options)


def refused(body, chat=False, **options) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body, chat, **options)
    assert info.value.status == 400, info.value.message
    return info.value


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("change, param", [
    ({"prompt": "a\ud800b"}, "prompt"),
    ({"prompt": ["a\udfff"]}, "prompt"),
    ({"stop": ["ok", "\ud800"]}, "stop"),
    ({"stop": "\udc00"}, "stop"),
    ({"stop": ["s" * 1025]}, "stop"),   # what a decode node refuses (nodes/wire/request_readers.py)
    ({"user": "\ud800"}, "user"),
    ({"model": "\ud800"}, "model"),
    ({"session_id": "\ud800"}, "session_id"),
    ({"session_id": "x" * 300}, "session_id"),
    ({"session_id": "x" * (MAX_SESSION_ID_CHARS + 1)}, "session_id"),
    ({"session_id": "a\r\nSet-Cookie: x=1"}, "session_id"),
    ({"session_id": "caf\u00e9"}, "session_id"),
    ({"session_id": 5}, "session_id"),
    ({"seed": 2 ** 70}, "seed"),
    ({"seed": -(2 ** 64)}, "seed"),
    ({"top_k": 2 ** 70}, "top_k"),
    ({"prompt": [1, 2 ** 70]}, "prompt"),
    ({"prompt": [1, -1]}, "prompt"),
    ({"max_tokens": 2 ** 70}, "max_tokens"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": 10 ** 400}, "temperature"),
    ({"top_p": float("inf")}, "top_p"),
    ({"presence_penalty": 10 ** 400}, "presence_penalty"),
    ({"n": 10 ** 400}, "n"),
])
def test_what_the_bus_cannot_carry_is_a_400_naming_the_field(change, param):
    assert refused({**GOOD, **change}).param == param


def test_chat_content_that_is_not_utf8_is_a_400():
    for content in ("\ud800", [{"type": "text", "text": "\udfff"}]):
        assert refused({"model": MODEL, "messages": [{"role": "user", "content": content}]}, chat=True).param == \
            "messages"


@pytest.mark.parametrize("header", ["x" * 300, "\ud800", "a\nb", "a b", ""])
def test_a_session_header_is_held_to_the_same_rules(header):
    if header:
        assert refused(GOOD, session_header=header).param == "session_id"
    else:
        assert parse(GOOD, session_header=header).session_id is None


def test_a_session_id_at_the_bound_of_visible_ascii_is_accepted():
    session = "".join(chr(c) for c in range(0x21, 0x7F))[:MAX_SESSION_ID_CHARS]
    assert parse({**GOOD, "session_id": session}).session_id == session


def test_nesting_deeper_than_the_bus_carries_is_a_400_even_in_an_ignored_field():
    assert parse({**GOOD, "extra": nested(MAX_DEPTH - 2)}).ignored_fields == ("extra",)
    assert "nest" in refused({**GOOD, "extra": nested(MAX_DEPTH + 1)}).message


def test_ignored_field_names_are_bounded_and_printable():
    body = {**GOOD, **{f"f{i}": 1 for i in range(1000)}, "\ud800": 1}
    ignored = parse(body).ignored_fields
    assert len(ignored) <= 32 and all(name.isascii() and name.isprintable() for name in ignored)


def test_the_404_for_an_unknown_model_does_not_echo_it_raw():
    with pytest.raises(ApiError) as info:
        parse({**GOOD, "model": "x" * 5000})
    assert info.value.status == 404 and len(info.value.message) < 300


# -- the property ----------------------------------------------------------------------------
JSON_INTS = st.integers(min_value=-(10 ** 30), max_value=10 ** 30) | st.sampled_from(
    [2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -(2 ** 63), -(2 ** 63) - 1, 10 ** 400])
TEXT = st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb", "x" * 200, "s\r\n", "caf\u00e9"])
SCALARS = st.none() | st.booleans() | JSON_INTS | st.floats(allow_nan=True, allow_infinity=True) | TEXT
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(TEXT, inner, max_size=3), max_leaves=12)
DEEP = st.integers(min_value=MAX_DEPTH - 3, max_value=MAX_DEPTH + 3).map(nested)


def field_value(valid: st.SearchStrategy) -> st.SearchStrategy:
    return valid | ANY_JSON | DEEP


FIELDS = {
    "prompt": field_value(TEXT | st.lists(JSON_INTS, min_size=1, max_size=4) | st.lists(TEXT, max_size=1)),
    "max_tokens": field_value(st.integers(min_value=-1, max_value=200)),
    "temperature": field_value(st.floats(min_value=0, max_value=2)),
    "top_p": field_value(st.floats(min_value=0, max_value=1)),
    "top_k": field_value(JSON_INTS), "seed": field_value(JSON_INTS),
    "stop": field_value(TEXT | st.lists(TEXT, max_size=9)),
    "stream": field_value(st.booleans()), "user": field_value(TEXT), "session_id": field_value(TEXT),
    "stream_options": field_value(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "ignore_eos": field_value(st.booleans()), "n": field_value(st.just(1)),
    "presence_penalty": field_value(st.just(0)), "extra": ANY_JSON | DEEP,
}
BODIES = st.fixed_dictionaries({"model": st.just(MODEL) | ANY_JSON}, optional=FIELDS)
CHAT_BODIES = BODIES.flatmap(lambda body: st.fixed_dictionaries({
    "messages": field_value(st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "system", "wizard"]),
        "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)}),
        min_size=1, max_size=3))}).map(lambda messages: {**body, **messages}))


def check_parse(body: dict, chat: bool, header: str | None) -> None:
    try:
        request = parse(body, chat, session_header=header)
    except ApiError as error:
        assert error.status in (400, 404)
        json.dumps(error.body(), ensure_ascii=False).encode()   # an error frame can always be sent
        return
    pack(dataclasses.asdict(request))
    sampling = SamplingParams(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p,
                              seed=request.seed, max_tokens=request.max_tokens or 1, stop=request.stop)
    wire.check_carriable(wire.to_wire(sampling), "sampling")
    if request.session_id is not None:
        wire.check_routing_key(request.session_id)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODIES, header=st.none() | TEXT)
def test_any_completion_body_is_refused_cleanly_or_carriable(body, header):
    check_parse(body, False, header)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=CHAT_BODIES)
def test_any_chat_body_is_refused_cleanly_or_carriable(body):
    check_parse(body, True, None)
