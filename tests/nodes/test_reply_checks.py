"""The client's checks on reply bodies (nodes/reply_checks.py): what the nodes send parses into typed
values; anything msgpack can decode, in any field, is accepted or refused with `Refused`, never
anything else; a refusal's reason never quotes the body."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodes import reply_checks as checks
from nodes.body_checks import Refused
from tests.nodes.cluster_bus import decode_done, prefill_done, remote_plan, token

LIMIT = 16
SECRET = "s3cret-value"

# What msgpack (raw=False) can hand the client: scalars, ExtType, Timestamp, lists, str/bytes-keyed maps.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20),
                    st.binary(max_size=8), st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
                    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999)),
                    st.sampled_from([0, 1, -1, 2**31, 2**31 - 1, LIMIT, LIMIT - 1, float("nan"), float("inf"), SECRET]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=12), st.binary(max_size=4)), inner,
                                                 max_size=4)), max_leaves=12)


def mutated(good: dict) -> st.SearchStrategy:
    """`good` with some fields replaced by arbitrary values, dropped, or a whole other value."""
    fields = st.fixed_dictionaries({k: st.one_of(st.just(v), values) for k, v in good.items()})
    dropped = st.sets(st.sampled_from(sorted(good))).flatmap(
        lambda drop: fields.map(lambda body: {k: v for k, v in body.items() if k not in drop}))
    return st.one_of(fields, dropped, values)


PARSERS = {
    "plan": (lambda body: checks.plan(body), remote_plan("decode-0", "r1")),
    "token": (lambda body: checks.token(body, LIMIT), token(3, 7)),
    "prefill_done": (lambda body: checks.prefill_done(body, LIMIT), prefill_done([1, 2, 3])),
    "decode_done": (lambda body: checks.decode_done(body, LIMIT), decode_done([1, 2, 3], 4)),
}


@pytest.mark.parametrize("kind", list(PARSERS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_reply_body_is_accepted_or_refused_never_anything_else(kind, data):
    parse, good = PARSERS[kind]
    body = data.draw(mutated(good))
    try:
        parsed = parse(body)
    except Refused as refusal:
        assert SECRET not in refusal.reason and len(refusal.reason) < 300
        return
    assert_sound(parsed)


def assert_sound(parsed) -> None:
    """Whatever parses has the right types within range, all the way down."""
    if parsed is None:
        return
    for value in _leaves(parsed):
        assert value is None or isinstance(value, str | int | float), type(value)
        assert not isinstance(value, float) or (math.isfinite(value) and value >= 0)
        assert not isinstance(value, int) or 0 <= value < 2**63
        assert not isinstance(value, str) or len(value) <= checks.MAX_TEXT_CHARS
    for item in getattr(parsed, "tokens", ()) + ((parsed.token,) if getattr(parsed, "token", None) else ()):
        assert 0 <= item.index < LIMIT and 0 <= item.token_id < 2**31 and type(item.token_id) is int
    if isinstance(parsed, checks.Token):
        assert 0 <= parsed.index < LIMIT and 0 <= parsed.token_id < 2**31


def _leaves(value):
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif hasattr(value, "__slots__"):
        for name in value.__slots__:
            yield from _leaves(getattr(value, name))
    else:
        yield value


def test_what_the_nodes_send_parses_into_typed_values():
    plan = checks.plan(remote_plan("decode-0", "r1"))
    assert (plan.kind, plan.node_id, plan.transfer_id) == ("remote", "decode-0", "t-r1")
    assert checks.plan({"type": "plan", "plan": "cached", "node_id": "d", "num_cached_tokens": 9}).kind == "cached"
    assert checks.token(token(3, 7), LIMIT) == checks.Token(3, 7, "<7>")
    assert checks.token({"type": "progress"}, LIMIT) is None   # another kind of PARTIAL: ignored
    done = checks.prefill_done(prefill_done([1, 2, 3]), LIMIT)
    assert done.token == checks.Token(0, 103, "<103>") and done.transfer["mode"] == "raw"
    assert done.timings == {"queue_s": 0.0, "prefill_s": 0.01, "kv_transfer_s": 0.001}
    assert checks.prefill_done({"type": "done", "node_id": "p", "transfer": {}}, LIMIT).token is None
    final = checks.decode_done(decode_done([1, 2, 3], 4), LIMIT)
    assert [t.token_id for t in final.tokens] == [103, 104, 105, 106] and final.finish_reason == "length"
    assert final.as_trace()["stats"]["node_imported_tokens"] == 3 and final.usage["completion_tokens"] == 4


def test_timings_keep_only_the_nodes_own_stages_and_drop_nulls():
    body = {**decode_done([1], 1), "timings": {"decode_s": 0.5, "kv_wait_s": None, "ttft_s": 9.0, "x": "y"}}
    assert checks.decode_done(body, LIMIT).timings == {"decode_s": 0.5}


@pytest.mark.parametrize("body", [
    {**token(0, 7), "index": LIMIT}, {**token(0, 7), "token_id": 2**31}, {**token(0, 7), "token_id": True},
    {**token(0, 7), "text": "x" * (checks.MAX_TEXT_CHARS + 1)}, {**token(0, 7), "index": 1.0}])
def test_token_fields_out_of_range_are_refused(body):
    with pytest.raises(Refused):
        checks.token(body, LIMIT)


def test_a_final_listing_more_tokens_than_the_request_may_produce_is_refused():
    with pytest.raises(Refused, match="tokens"):
        checks.decode_done(decode_done([1], LIMIT + 1), LIMIT)


@pytest.mark.parametrize(("details", "expected"), [
    ({"node_id": "decode-1", "retry_after_s": 1.5}, ("decode-1", 1.5)),
    ({"node_id": {"x": 1}, "retry_after_s": "soon"}, ("fallback", None)),
    ({"node_id": "n" * 500, "retry_after_s": float("inf")}, ("fallback", None)),
    ({"retry_after_s": 10**9}, ("fallback", checks.MAX_RETRY_AFTER_S)), ({"retry_after_s": -1}, ("fallback", None)),
    ({"retry_after_s": True}, ("fallback", None)), ({}, ("fallback", None))])
def test_error_details_are_read_never_trusted(details, expected):
    assert checks.error_details(details, "fallback") == expected


def test_summary_and_claimed_node_never_print_the_body():
    assert checks.claimed_node({"node_id": "decode-1"}) == "decode-1"
    assert checks.claimed_node({"node_id": SECRET * 50}) == "" and checks.claimed_node(1.5) == ""
