"""The checks on peer-supplied bodies (nodes/body_checks.py): any value in any field is either
accepted as a typed, in-range value or refused with a short reason and a clear code; nothing
else is ever raised. Property tests over arbitrary msgpack-shaped values, plus the bodies our own
client builds, which must always pass."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes import body_checks as checks
from nodes import cluster_wire as wire
from nodes.engines.base import SamplingParams

LIMITS = checks.Limits(vocab_size=512, max_model_len=256)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
           | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
           | st.binary(max_size=20))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                        | st.dictionaries(st.text(max_size=10), inner, max_size=5), max_leaves=20)
token_ids = (st.lists(st.integers(0, LIMITS.vocab_size - 1), min_size=1, max_size=300)
             | st.lists(st.integers(-2, LIMITS.vocab_size + 2), max_size=300))
ids = st.text(min_size=1, max_size=20) | st.text(max_size=140)


def field(plausible):
    """A field's value: mostly plausible, sometimes anything at all, sometimes missing."""
    return st.integers(0, 9).flatmap(lambda n: plausible if n < 7 else anything if n < 9 else st.just(checks.MISSING))


def body_of(**fields):
    return st.fixed_dictionaries({k: field(v) for k, v in fields.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not checks.MISSING})


sampling_maps = body_of(temperature=st.floats(0, 2) | st.floats(-1, 200), top_k=st.integers(0, 50) | st.integers(-1, 2**40),
                        top_p=st.floats(0.1, 1) | st.floats(-0.5, 1.5), max_tokens=st.integers(1, 64) | st.integers(-1, 2**40),
                        seed=st.none() | st.integers(-(2**64), 2**65), stop=st.lists(st.text(max_size=5), max_size=70),
                        stop_token_ids=st.lists(st.integers(0, 511), max_size=4) | token_ids, ignore_eos=st.booleans())
decode_bodies = body_of(prompt_token_ids=token_ids, sampling=sampling_maps, session_id=st.none() | ids,
                        prefill=st.sampled_from(["auto", "local", "remote"]), resume=st.none() | st.just({}))
prefill_bodies = body_of(prompt_token_ids=token_ids, sampling=sampling_maps, decode_node_id=ids,
                         data_endpoint=st.text(min_size=1, max_size=60) | st.text(max_size=600), transfer_id=ids, request_id=ids,
                         urgent=st.booleans())
kv_ready_bodies = body_of(type=st.just(wire.KV_READY), request_id=ids, transfer_id=ids,
                          first_token_id=st.integers(-2, 2**64))


def outcome(check, body):
    """The check's value, or the refusal, which must be short, coded, and quote nothing."""
    try:
        return check(body, LIMITS)
    except checks.Refused as refusal:
        assert refusal.code in (wire.BAD_REQUEST, wire.REJECTED)
        assert 0 < len(refusal.reason) <= 200
        return refusal


def valid_ids(values) -> bool:
    return all(type(t) is int and 0 <= t < LIMITS.vocab_size for t in values)


def valid_id(value) -> bool:
    return isinstance(value, str) and 0 < len(value.encode()) <= 128


def valid_sampling(s: SamplingParams) -> bool:
    return (math.isfinite(s.temperature) and s.temperature >= 0 and 0 < s.top_p <= 1 and s.max_tokens >= 1
            and all(isinstance(x, str) and x for x in s.stop) and valid_ids(s.stop_token_ids))


@SETTINGS
@given(decode_bodies | anything)
def test_a_decode_request_body_is_accepted_in_range_or_refused(body):
    result = outcome(checks.decode_request, body)
    if isinstance(result, checks.DecodeBody):
        assert 0 < len(result.prompt) < LIMITS.max_model_len and valid_ids(result.prompt)
        assert result.prefill in ("auto", "local") and valid_sampling(result.sampling)
        assert result.session_id is None or valid_id(result.session_id)


@SETTINGS
@given(prefill_bodies | anything)
def test_a_prefill_request_body_is_accepted_in_range_or_refused(body):
    result = outcome(checks.prefill_request, body)
    if isinstance(result, checks.PrefillBody):
        assert 0 < len(result.prompt) < LIMITS.max_model_len and valid_ids(result.prompt)
        assert all(valid_id(v) for v in (result.decode_node_id, result.transfer_id, result.decode_request_id))
        assert isinstance(result.urgent, bool) and valid_sampling(result.sampling)


@SETTINGS
@given(kv_ready_bodies | anything)
def test_a_kv_ready_body_is_accepted_in_range_or_refused(body):
    result = outcome(checks.kv_ready, body)
    if isinstance(result, checks.KvReady):
        assert valid_id(result.request_id) and valid_id(result.transfer_id)
        assert valid_ids([result.first_token_id])


sampling_params = st.builds(SamplingParams, temperature=st.floats(0, 100), top_k=st.integers(0, 1000),
                            top_p=st.floats(0.01, 1), seed=st.none() | st.integers(-(2**63), 2**64 - 1),
                            max_tokens=st.integers(1, 10**6), stop=st.lists(st.text(min_size=1, max_size=8),
                                                                           max_size=8).map(tuple),
                            stop_token_ids=st.lists(st.integers(0, 511), max_size=8).map(tuple),
                            ignore_eos=st.booleans())


@SETTINGS
@given(sampling_params)
def test_what_our_client_sends_always_passes_unchanged(sampling):
    body = {"prompt_token_ids": [1, 2, 3], "sampling": wire.sampling_to_wire(sampling), "session_id": "chat-1",
            "prefill": "auto", "resume": {"num_delivered": 3}}
    assert checks.decode_request(body, LIMITS) == checks.DecodeBody((1, 2, 3), sampling, "chat-1", "auto")
    assert checks.kv_ready(wire.kv_ready_body("r" * 128, "t", 511), LIMITS) == checks.KvReady("r" * 128, "t", 511)


def test_reasons_name_fields_not_values():
    refusal = outcome(checks.kv_ready, {"request_id": "r", "transfer_id": "t", "first_token_id": "SECRET" * 50})
    assert "first_token_id" in refusal.reason and "SECRET" not in refusal.reason
    assert outcome(checks.decode_request, {"prompt_token_ids": [5] * 300}).code == wire.REJECTED
    assert outcome(checks.decode_request, {"prompt_token_ids": [10**6]}).code == wire.REJECTED
    assert outcome(checks.prefill_request, {"prompt_token_ids": [10**6]}).code == wire.BAD_REQUEST


def test_summary_is_bounded_whatever_the_value():
    nested: list = []
    for _ in range(10_000):
        nested = [nested]
    assert checks.summary(nested) == "list[1]"
    assert checks.summary({"a": 1, "b": 2}) == "dict[2]" and checks.summary(3.5) == "float"
