"""What a node reads (nodes/wire/request_readers.py): what our client sends always passes unchanged;
a prompt that can never fit is `rejected` in a decode request and `bad_request` elsewhere; a reason
names fields and bounds, never a value from the body."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings

from nodes import wire
from tests.nodes.wire.strategies import BOUNDS, sampling

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def refusal(kind, body) -> wire.Refused:
    try:
        wire.from_wire(kind, body, BOUNDS)
    except wire.Refused as refused:
        return refused
    raise AssertionError("accepted")


@SETTINGS
@given(sampling)
def test_what_our_client_sends_always_passes_unchanged(params):
    body = {"prompt_token_ids": [1, 2, 3], "sampling": wire.to_wire(params), "session_id": "chat-1",
            "prefill": "auto", "resume": {"num_delivered": 3}}
    assert wire.from_wire(wire.DecodeRequestBody, body, BOUNDS) == wire.DecodeRequestBody(
        (1, 2, 3), params, "chat-1", wire.PrefillMode.AUTO, 3)
    ready = wire.to_wire(wire.KvReadyBody("r" * 128, "t", 511))
    assert wire.from_wire(wire.KvReadyBody, ready, BOUNDS) == wire.KvReadyBody("r" * 128, "t", 511)


def test_defaults_fill_what_a_request_leaves_out():
    body = wire.from_wire(wire.DecodeRequestBody, {"prompt_token_ids": [5], "session_id": ""}, BOUNDS)
    assert body == wire.DecodeRequestBody((5,), wire.SamplingParams(), None, wire.PrefillMode.AUTO, 0)
    assert wire.from_wire(wire.SamplingParams, {"max_tokens": 4, "unknown": 1}, BOUNDS).max_tokens == 4


def test_reasons_name_fields_not_values():
    refused = refusal(wire.KvReadyBody, {"type": "kv_ready", "request_id": "r", "transfer_id": "t",
                                         "first_token_id": "SECRET" * 50})
    assert "first_token_id" in refused.reason and "SECRET" not in refused.reason
    assert refusal(wire.DecodeRequestBody, {"prompt_token_ids": [5] * 300}).code == wire.Code.REJECTED
    assert refusal(wire.DecodeRequestBody, {"prompt_token_ids": [10**6]}).code == wire.Code.REJECTED
    assert refusal(wire.PrefillRequestBody, {"prompt_token_ids": [10**6]}).code == wire.Code.BAD_REQUEST
    assert refusal(wire.SamplingParams, {"max_tokens": 0}).code == wire.Code.BAD_REQUEST
    assert "resume" in refusal(wire.DecodeRequestBody, {"prompt_token_ids": [5], "resume": "yes"}).reason


def test_summary_is_bounded_whatever_the_value():
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    assert wire.summary(nested) == "list[1]"
    assert wire.summary({"a": 1, "b": 2}) == "dict[2]" and wire.summary(3.5) == "float"


def test_a_prefill_request_carries_its_cache_salt_bounded_and_only_when_set():
    body = wire.PrefillRequestBody((1, 2), wire.SamplingParams(), "decode-0", "tcp://127.0.0.1:1", "t", "r",
                                   cache_salt="a1b2c3")
    assert wire.from_wire(wire.PrefillRequestBody, wire.to_wire(body), BOUNDS) == body
    unsalted = wire.to_wire(dataclasses.replace(body, cache_salt=""))
    assert "cache_salt" not in unsalted   # what an older client sent: read as no salt
    assert wire.from_wire(wire.PrefillRequestBody, unsalted, BOUNDS).cache_salt == ""
    for bad in ("s" * 129, 7, ["x"]):
        refused = refusal(wire.PrefillRequestBody, {**wire.to_wire(body), "cache_salt": bad})
        assert refused.code == wire.Code.BAD_REQUEST and "cache_salt" in refused.reason


def test_a_decode_request_carries_its_cache_salt_only_when_set():
    body = wire.DecodeRequestBody((1, 2), wire.SamplingParams(), "s", cache_salt="tenant-1")
    assert wire.from_wire(wire.DecodeRequestBody, wire.to_wire(body), BOUNDS) == body
    plain = wire.to_wire(dataclasses.replace(body, cache_salt=""))
    assert "cache_salt" not in plain and wire.from_wire(wire.DecodeRequestBody, plain, BOUNDS).cache_salt == ""
    for bad in ("s" * 129, 7, ["x"]):
        refused = refusal(wire.DecodeRequestBody, {**wire.to_wire(body), "cache_salt": bad})
        assert refused.code == wire.Code.BAD_REQUEST and "cache_salt" in refused.reason


def test_a_prefill_request_kv_offset_is_bounded_by_its_prompt():
    body = wire.PrefillRequestBody((1, 2, 3), wire.SamplingParams(), "decode-0", "tcp://127.0.0.1:1", "t", "r",
                                   kv_offset=2)
    assert wire.from_wire(wire.PrefillRequestBody, wire.to_wire(body), BOUNDS) == body
    assert "kv_offset" not in wire.to_wire(dataclasses.replace(body, kv_offset=0))   # what older clients send
    for bad in (3, -1, 1.5, "2", True, None):   # the whole prompt, or not a count: nothing would be sent
        refused = refusal(wire.PrefillRequestBody, {**wire.to_wire(body), "kv_offset": bad})
        assert refused.code == wire.Code.BAD_REQUEST and "kv_offset" in refused.reason
