"""A node that answers with bodies of the wrong shape (issue #39: a cluster survives its worst peer):
each malformed reply the client acts on is that node failing the request: its stream is
cancelled and the request fails over as for a lost node (a decode resume on another node, a
prefill re-sent), spending a retry, and still ends with exactly the undisturbed tokens. Never
`internal`, never an exception asyncio reports as never retrieved. Over scripted nodes
(tests/nodes/cluster/scripted_bus.py)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import msgpack
import pytest

from bus.messages import Final, Partial
from nodes.cluster import ClusterClient, ClusterError
from nodes.cluster.attempt import Attempt
from nodes.engines.base import SamplingParams
from tests.nodes.cluster.scripted_bus import (
    ClusterBus,
    decode_done,
    expected,
    first_id,
    good_decode,
    good_prefill,
    prefill_done,
    token,
)

PROMPT, MAX_TOKENS = [1, 2, 3], 5
ODD_VALUES = {"float": 1.5, "list": [0, 5, "x"], "str": "done", "bool": True, "none": None,
              "ext": msgpack.ExtType(5, b"x"), "timestamp": msgpack.Timestamp(1, 0)}


async def serve(bus: ClusterBus, **options) -> tuple:
    """Run one request; its tokens, trace and what asyncio reported unhandled."""
    loop, unhandled = asyncio.get_running_loop(), []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    client = ClusterClient("tcp://127.0.0.1:1", retry_delay_s=0.001, stall_timeout_s=2.0, plan_timeout_s=2.0,
                           **{"max_retries": 2, **options})
    client.bus = bus
    generation = client.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), session_id="s1")
    try:
        result = await asyncio.wait_for(generation.collect(), 20)
    finally:
        await asyncio.sleep(0.01)
        gc.collect()
        loop.set_exception_handler(None)
    return result, unhandled


def assert_failed_over(result, unhandled, bus: ClusterBus, code: str) -> None:
    assert result.token_ids == expected(PROMPT, MAX_TOKENS)
    assert result.text == "".join(f"<{t}>" for t in result.token_ids)
    assert code in [f.split("@")[0] for f in result.trace.failures], result.trace.failures
    assert result.trace.num_bad_replies >= 1
    assert not unhandled, unhandled
    assert bus.open == {}, "a stream was left open"


# -- a hostile decode node (the session's home); the spare one is healthy ----------------------
def hostile_decode(stage: str, bad) -> Any:
    """Plans local and streams good tokens, with `bad` as its plan, its third token or its FINAL
    (after three tokens)."""
    async def node(bus, put, body, rid):
        prompt = body["prompt_token_ids"]
        put(Partial(rid, 0, bad if stage == "plan" else {"type": "plan", "plan": "local", "node_id": "decode-bad"}))
        for index in range({"plan": 0, "token": 2, "final": 3}[stage]):
            put(Partial(rid, index + 1, token(index, first_id(len(prompt) + index))))
        if stage == "token":
            put(Partial(rid, 3, bad))
        elif stage == "final":
            put(Final(rid, 4, bad))
        await asyncio.sleep(30)   # then silence: the client must cancel, not wait
    return node


GOOD_TOKEN, GOOD_DONE = token(2, first_id(5)), decode_done(PROMPT, 3, "decode-bad")
DECODE_CASES = {
    **{f"plan-{name}": ("plan", value) for name, value in ODD_VALUES.items()},
    "plan-missing": ("plan", {"type": "plan"}), "plan-unknown": ("plan", {"type": "plan", "plan": "?", "node_id": "d"}),
    "plan-remote-no-endpoint": ("plan", {"type": "plan", "plan": "remote", "node_id": "d", "transfer_id": "t"}),
    "plan-node-id-map": ("plan", {"type": "plan", "plan": "local", "node_id": {"a": 1}}),
    # KV it claims to hold for the whole prompt (3 tokens) or beyond: nothing would be left to send.
    "plan-holds-whole-prompt": ("plan", {"type": "plan", "plan": "remote", "node_id": "d", "transfer_id": "t",
                                         "data_endpoint": "tcp://127.0.0.1:9", "num_cached_tokens": 3}),
    "plan-holds-negative": ("plan", {"type": "plan", "plan": "local", "node_id": "d", "num_cached_tokens": -1}),
    "plan-holds-text": ("plan", {"type": "plan", "plan": "cached", "node_id": "d", "num_cached_tokens": "2"}),
    **{f"token-{name}": ("token", value) for name, value in ODD_VALUES.items()},
    "token-no-index": ("token", {k: v for k, v in GOOD_TOKEN.items() if k != "index"}),
    "token-no-id": ("token", {k: v for k, v in GOOD_TOKEN.items() if k != "token_id"}),
    "token-id-dict": ("token", {**GOOD_TOKEN, "token_id": {}}),
    "token-id-text": ("token", {**GOOD_TOKEN, "token_id": "x" * 5000}),
    "token-id-huge": ("token", {**GOOD_TOKEN, "token_id": 2**40}),
    "token-id-negative": ("token", {**GOOD_TOKEN, "token_id": -1}),
    "token-index-negative": ("token", {**GOOD_TOKEN, "index": -3}),
    "token-index-far": ("token", {**GOOD_TOKEN, "index": 10**9}),
    "token-text-bytes": ("token", {**GOOD_TOKEN, "text": b"x"}),
    "token-text-long": ("token", {**GOOD_TOKEN, "text": "x" * 100_000}),
    **{f"final-{name}": ("final", value) for name, value in ODD_VALUES.items()},
    "final-tokens-float": ("final", {**GOOD_DONE, "tokens": 1.5}),
    "final-tokens-4": ("final", {**GOOD_DONE, "tokens": [[0, 5, "x", 7]]}),
    "final-timings-list": ("final", {**GOOD_DONE, "timings": [1, 2]}),
    "final-timings-text": ("final", {**GOOD_DONE, "timings": {"decode_s": "slow"}}),
    "final-stats-list": ("final", {**GOOD_DONE, "stats": [1]}),
    "final-stats-text": ("final", {**GOOD_DONE, "stats": {"kv_raw_bytes": "a"}}),
    "final-stats-negative": ("final", {**GOOD_DONE, "stats": {"kv_raw_bytes": -5}}),
    "final-usage-float": ("final", {**GOOD_DONE, "usage": 2.5}),
    "final-usage-over-max": ("final", {**GOOD_DONE, "usage": {"prompt_tokens": 3, "completion_tokens": 99}}),
    "final-finish-reason": ("final", {**GOOD_DONE, "finish_reason": {"x": 1}}),
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
async def test_a_decode_node_sending_a_malformed_reply_is_failed_over_to_a_healthy_one(case):
    bus = ClusterBus(home=hostile_decode(*DECODE_CASES[case]), spare=good_decode("local"))
    result, unhandled = await serve(bus)
    assert_failed_over(result, unhandled, bus, "bad_reply")
    assert result.trace.num_failovers == 1 and "decode-good" in result.trace.decode_node_ids


async def test_a_failed_over_request_is_routed_away_from_the_node_that_failed_it():
    bus = ClusterBus(home=hostile_decode("token", [1, 2]), spare=good_decode("remote"))
    result, unhandled = await serve(bus)
    assert_failed_over(result, unhandled, bus, "bad_reply")
    keys = [(key, body["resume"]) for service, key, body in bus.sent if service == "decode"]
    assert keys[0] == ("s1", None) and keys[1][0] != "s1" and keys[1][1] == {"num_delivered": 2}
    assert all(body["session_id"] == "s1" for service, _, body in bus.sent if service == "decode")


async def test_a_node_that_keeps_answering_malformed_replies_exhausts_the_retries_not_internal():
    bus = ClusterBus(home=hostile_decode("plan", 1.5), spare=hostile_decode("token", [1]))
    with pytest.raises(ClusterError) as info:
        await serve(bus, max_retries=1)
    assert info.value.code == "retries_exhausted" and bus.open == {}


# -- a hostile prefill node first; the second prefill node is healthy --------------------------
def hostile_prefill(stage: str, bad) -> Any:
    async def node(bus, put, body, rid):
        prompt = body["prompt_token_ids"]
        put(Partial(rid, 0, bad if stage == "token" else token(0, first_id(len(prompt)))))
        if stage == "final":
            put(Final(rid, 1, bad))
        await asyncio.sleep(30)
    return node


GOOD_FINAL = prefill_done(PROMPT, "prefill-bad")
PREFILL_CASES = {
    **{f"final-{name}": ("final", value) for name, value in ODD_VALUES.items()},
    "final-token-float": ("final", {**GOOD_FINAL, "token": 1.5}),
    "final-token-4": ("final", {**GOOD_FINAL, "token": [0, 5, "x", 7]}),
    "final-token-id-text": ("final", {**GOOD_FINAL, "token": [0, "xxx", "x"]}),
    "final-transfer-float": ("final", {**GOOD_FINAL, "transfer": 1.5}),
    "final-transfer-bytes-text": ("final", {**GOOD_FINAL, "transfer": {"wire_bytes": "many"}}),
    "final-timings-list": ("final", {**GOOD_FINAL, "timings": [1]}),
    "final-timings-nan": ("final", {**GOOD_FINAL, "timings": {"prefill_s": float("nan")}}),
    "final-node-id-list": ("final", {**GOOD_FINAL, "node_id": ["a"]}),
    **{f"token-{name}": ("token", value) for name, value in ODD_VALUES.items()},
    "token-no-index": ("token", {"type": "token", "token_id": 5, "text": "x"}),
    "token-no-id": ("token", {"type": "token", "index": 0, "text": "x"}),
    "token-id-text": ("token", {"type": "token", "index": 0, "token_id": "xx", "text": "x"}),
    "token-id-dict": ("token", {"type": "token", "index": 0, "token_id": {}, "text": "x"}),
}


@pytest.mark.parametrize("case", list(PREFILL_CASES))
async def test_a_prefill_node_sending_a_malformed_reply_is_replaced_by_a_re_sent_prefill(case):
    bus = ClusterBus(home=good_decode("remote"), prefills=(hostile_prefill(*PREFILL_CASES[case]), good_prefill))
    result, unhandled = await serve(bus)
    assert_failed_over(result, unhandled, bus, "prefill_bad_reply")
    assert result.trace.num_prefill_retries == 1 and result.trace.prefill_node_ids[-1] == "prefill-good"
    transfer_ids = [body["transfer_id"] for service, _, body in bus.sent if service == "prefill"]
    assert len(transfer_ids) == 2 and transfer_ids[0] != transfer_ids[1]


async def test_an_unexpected_error_handling_one_reply_fails_over_instead_of_crashing(monkeypatch):
    original, calls = Attempt.deliver, []

    def deliver(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("a bug on one reply")
        return original(self, *args)

    monkeypatch.setattr(Attempt, "deliver", deliver)
    bus = ClusterBus(home=good_decode("local", "decode-home"), spare=good_decode("local"))
    result, unhandled = await serve(bus)
    assert_failed_over(result, unhandled, bus, "bad_reply")


async def test_an_error_whose_details_are_of_the_wrong_types_is_still_a_plain_retry():
    from bus.messages import Error

    good, calls = good_decode("local"), []

    async def refusing_once(bus, put, body, rid):
        calls.append(rid)
        if len(calls) > 1:
            return await good(bus, put, body, rid)
        put(Error(rid, "kv_timeout", "no KV", {"node_id": {"x": [1]}, "retry_after_s": "soon"}))

    bus = ClusterBus(home=refusing_once)
    result, unhandled = await serve(bus)
    assert result.token_ids == expected(PROMPT, MAX_TOKENS) and not unhandled
    assert result.trace.failures[0] == "kv_timeout@"
