"""The codec's two properties, for every body kind (nodes/wire/body_codec.py): a body within the bounds
survives the bus unchanged (dataclass -> to_wire -> msgpack -> from_wire == the dataclass), and any
value msgpack can decode, in any field, is either read as a typed body within the bounds or refused
with `Refused` (a short reason that quotes nothing), never anything else."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus import codec
from nodes import wire
from tests.nodes.wire.strategies import BOUNDS, SECRET, bodies, mutated, values

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = list(bodies)
NODE_READS = {wire.DecodeRequestBody, wire.PrefillRequestBody, wire.KvReadyBody, wire.SamplingParams}


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@SETTINGS
@given(data=st.data())
def test_a_body_survives_the_bus_unchanged(kind, data):
    body = data.draw(bodies[kind])
    sent = wire.to_wire(body)
    wire.check_carriable(sent)   # the bus can carry what the codec builds
    assert wire.from_wire(kind, codec.unpack(codec.pack(sent)), BOUNDS) == body


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@SETTINGS
@given(data=st.data())
def test_any_value_is_read_within_the_bounds_or_refused_never_anything_else(kind, data):
    good = wire.to_wire(data.draw(bodies[kind]))
    value = data.draw(st.one_of(mutated(good), values))
    try:
        body = wire.from_wire(kind, value, BOUNDS)
    except wire.Refused as refusal:
        assert SECRET not in refusal.reason and 0 < len(refusal.reason) <= 200
        assert refusal.code in ((wire.Code.BAD_REQUEST, wire.Code.REJECTED) if kind in NODE_READS
                                else (wire.Code.BAD_REQUEST,))
        return
    assert type(body) is kind
    assert_within_bounds(body)
    assert wire.from_wire(kind, wire.to_wire(body), BOUNDS) == body   # what was read is a body the codec writes


def assert_within_bounds(body) -> None:
    """Whatever is read has the right types within range, all the way down."""
    for value in _leaves(body):
        assert value is None or isinstance(value, str | int | float), type(value)
        assert not isinstance(value, float) or math.isfinite(value)
        assert not isinstance(value, str) or len(value.encode()) <= 8192 * 4
    for token in _tokens(body):
        assert 0 <= token.index < BOUNDS.max_tokens and 0 <= token.token_id < BOUNDS.vocab_size
    prompt = getattr(body, "prompt", None)
    if prompt is not None:
        assert 0 < len(prompt) < BOUNDS.max_model_len and all(0 <= t < BOUNDS.vocab_size for t in prompt)
    if isinstance(body, wire.SamplingParams | wire.DecodeRequestBody | wire.PrefillRequestBody):
        s = body if isinstance(body, wire.SamplingParams) else body.sampling
        assert 0 <= s.temperature <= 100 and 0 < s.top_p <= 1 and s.max_tokens >= 1
        assert all(s.stop) and all(0 <= t < BOUNDS.vocab_size for t in s.stop_token_ids)


def _tokens(body) -> list:
    found = list(getattr(body, "tokens", ()))
    if isinstance(getattr(body, "token", None), wire.TokenBody):
        found.append(body.token)
    return [*found, body] if isinstance(body, wire.TokenBody) else found


def _leaves(value):
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif hasattr(value, "__slots__") and hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _leaves(getattr(value, name))
    else:
        yield value
