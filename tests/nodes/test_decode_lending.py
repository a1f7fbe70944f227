"""The lending rule (docs/CLUSTER.md, the `local` plan): a decode node with a light batch prefills a
short enough prompt itself when its client reports a prefill backlog, and only then; the client
reports its backlog (tokens sent to prefill nodes and not yet prefilled) in each decode request."""

from __future__ import annotations

import asyncio
import time

import pytest

from nodes import wire
from nodes.cluster.attempt import Attempt
from nodes.cluster.attempt_inputs import PrefillBacklog
from nodes.cluster.retries import Retry
from nodes.node_settings import LendSettings
from nodes.wire import Code
from tests.nodes.cluster.test_attempt import Delivered, spec
from tests.nodes.test_decode_node import PROMPT, make_work, request, run_until_idle

LEND = LendSettings(prefill_tokens=len(PROMPT), max_running=1, min_backlog_tokens=100)


def plan_of(endpoint, request_id):
    return endpoint.of("partial", request_id)[0]["plan"]


@pytest.mark.parametrize("backlog, prompt, expected", [
    (100, PROMPT, "local"),               # a backlog, a light batch, a short prompt: prefilled here
    (99, PROMPT, "remote"),               # too little waiting at the prefill nodes to be worth it
    (0, PROMPT, "remote"),                # the prefill node is idle: it is as fast, and keeps this core free
    (100, PROMPT + [13], "remote"),       # longer than the lending budget
])
def test_a_light_decode_node_lends_its_core_only_when_the_prompt_would_queue(kv_thread, backlog, prompt, expected):
    work, endpoint, _ = make_work(kv_thread, lend=LEND)
    work.on_message(request("r1", prompt_token_ids=prompt, prefill_backlog_tokens=backlog))
    assert plan_of(endpoint, "r1") == expected
    assert work.capacity()["prefills_lent"] == (expected == "local")


def test_a_busy_decode_node_does_not_lend(kv_thread):
    work, endpoint, _ = make_work(kv_thread, lend=LEND)
    work.on_message(request("r1", prefill_backlog_tokens=500))
    work.on_message(request("r2", prefill_backlog_tokens=500))
    assert [plan_of(endpoint, r) for r in ("r1", "r2")] == ["local", "remote"]   # r1 runs here now
    run_until_idle(work)
    assert endpoint.of("final", "r1")


def test_lending_is_off_by_default(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1", prefill_backlog_tokens=10_000))
    assert plan_of(endpoint, "r1") == "remote"


def test_the_backlog_counts_until_the_first_token_or_the_end():
    backlog = PrefillBacklog()
    with backlog.holding(300) as prefilled, backlog.holding(200):
        assert backlog.num_tokens == 500
        prefilled()
        prefilled()   # idempotent: a retried prefill's first token again
        assert backlog.num_tokens == 200
    assert backlog.num_tokens == 0


def test_each_decode_request_reports_the_client_s_backlog():
    owner = Delivered()
    sent = []

    def record(service, body, key=""):
        sent.append(body)
        raise ValueError("stop here")   # nothing travels: the attempt ends as `malformed`

    owner.open_stream = record
    with owner.prefill_backlog.holding(640), pytest.raises(Retry) as retry:
        asyncio.run(Attempt(owner, spec()).run())
    assert retry.value.code == Code.MALFORMED
    assert wire.from_wire(wire.DecodeRequestBody, sent[0]).prefill_backlog_tokens == 640


def test_a_decode_node_lends_only_while_it_would_finish_the_prompt_sooner(kv_thread):
    """margin x (own queue + prompt) < backlog + prompt: with r1's 8 tokens still to prefill here,
    a backlog of 12 at the prefill nodes is the shorter queue; once r1 has its first token, it is not."""
    lend = LendSettings(prefill_tokens=64, max_running=8, min_backlog_tokens=1, margin=1.4)
    work, endpoint, _ = make_work(kv_thread, lend=lend)
    work.on_message(request("r1", prefill_backlog_tokens=100))
    work.on_message(request("r2", prefill_backlog_tokens=12))    # 1.4 x (8 + 8) = 22.4 >= 12 + 8
    assert [plan_of(endpoint, r) for r in ("r1", "r2")] == ["local", "remote"]
    for _ in range(10):
        if work.jobs["r1"].tokens:
            break
        work.work(time.monotonic())
    assert work.jobs["r1"].tokens, "r1 never got its first token"
    work.on_message(request("r3", prefill_backlog_tokens=12))    # 1.4 x (0 + 8) = 11.2 < 12 + 8
    assert plan_of(endpoint, "r3") == "local"
    assert work.capacity()["prefills_lent"] == 2
    run_until_idle(work)
    assert endpoint.of("final", "r1") and endpoint.of("final", "r3")
