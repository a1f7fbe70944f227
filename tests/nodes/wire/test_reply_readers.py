"""What the client reads (nodes/wire/reply_readers.py): what the nodes send parses into typed
values; fields out of range are refused; an ERROR's details are read, never trusted."""

from __future__ import annotations

import pytest

from nodes import wire
from tests.nodes.cluster.scripted_bus import decode_done, prefill_done, remote_plan, token

LIMIT = 16
BOUNDS = wire.Bounds(max_tokens=LIMIT)
SECRET = "s3cret-value"


def test_what_the_nodes_send_parses_into_typed_values():
    plan = wire.from_wire(wire.PlanBody, remote_plan("decode-0", "r1"))
    assert (plan.kind, plan.node_id, plan.transfer_id) == (wire.PlanKind.REMOTE, "decode-0", "t-r1")
    cached = wire.from_wire(wire.PlanBody, {"type": "plan", "plan": "cached", "node_id": "d", "num_cached_tokens": 9})
    assert cached == wire.PlanBody.cached("d", 9)
    held = wire.PlanBody.remote("d", "tcp://127.0.0.1:9", "t", num_cached_tokens=32)
    assert wire.from_wire(wire.PlanBody, wire.to_wire(held)) == held
    assert "num_cached_tokens" not in remote_plan("decode-0", "r1")   # what older nodes send: none held
    assert wire.from_wire(wire.PlanBody, wire.to_wire(wire.PlanBody.local("d", 16))).num_cached_tokens == 16
    assert wire.read_partial(token(3, 7), BOUNDS) == wire.TokenBody(3, 7, "<7>")
    assert wire.read_partial({"type": "progress"}, BOUNDS) is None   # another kind of PARTIAL: ignored
    done = wire.from_wire(wire.PrefillDoneBody, prefill_done([1, 2, 3]), BOUNDS)
    assert done.token == wire.TokenBody(0, 103, "<103>") and done.transfer.mode == "raw"
    assert done.timings.measured() == {"queue_s": 0.0, "prefill_s": 0.01, "kv_transfer_s": 0.001}
    bare = wire.from_wire(wire.PrefillDoneBody, {"type": "done", "node_id": "p", "transfer": {}}, BOUNDS)
    assert bare.token is None and bare.transfer == wire.TransferReport()
    final = wire.from_wire(wire.DecodeDoneBody, decode_done([1, 2, 3], 4), BOUNDS)
    assert [t.token_id for t in final.tokens] == [103, 104, 105, 106] and final.finish_reason == "length"
    assert final.stats["node_imported_tokens"] == 3 and final.usage.completion_tokens == 4


def test_timings_keep_only_the_nodes_own_stages_and_drop_nulls():
    body = {**decode_done([1], 1), "timings": {"decode_s": 0.5, "kv_wait_s": None, "ttft_s": 9.0, "x": "y"}}
    assert wire.from_wire(wire.DecodeDoneBody, body, BOUNDS).timings.measured() == {"decode_s": 0.5}


@pytest.mark.parametrize("body", [
    {**token(0, 7), "index": LIMIT}, {**token(0, 7), "token_id": 2**31}, {**token(0, 7), "token_id": True},
    {**token(0, 7), "text": "x" * 8193}, {**token(0, 7), "index": 1.0}, [1, 2]])
def test_token_fields_out_of_range_are_refused(body):
    with pytest.raises(wire.Refused):
        wire.read_partial(body, BOUNDS)


def test_a_final_listing_more_tokens_than_the_request_may_produce_is_refused():
    with pytest.raises(wire.Refused, match="tokens"):
        wire.from_wire(wire.DecodeDoneBody, decode_done([1], LIMIT + 1), BOUNDS)


@pytest.mark.parametrize(("details", "expected"), [
    ({"node_id": "decode-1", "retry_after_s": 1.5}, ("decode-1", 1.5)),
    ({"node_id": {"x": 1}, "retry_after_s": "soon"}, ("fallback", None)),
    ({"node_id": "n" * 500, "retry_after_s": float("inf")}, ("fallback", None)),
    ({"retry_after_s": 10**9}, ("fallback", 60.0)), ({"retry_after_s": -1}, ("fallback", None)),
    ({"retry_after_s": True}, ("fallback", None)), ({}, ("fallback", None)), ("details", ("fallback", None))])
def test_error_details_are_read_never_trusted(details, expected):
    assert wire.error_details(details, "fallback") == expected


def test_claimed_node_never_prints_the_body():
    assert wire.claimed_node({"node_id": "decode-1"}) == "decode-1"
    assert wire.claimed_node({"node_id": SECRET * 50}) == "" and wire.claimed_node(1.5) == ""


def test_claims_reads_only_the_type():
    assert wire.claims(wire.KvReadyBody, {"type": "kv_ready"}) and not wire.claims(wire.KvReadyBody, [1])
    assert not wire.claims(wire.KvReadyBody, {"type": "token"})
