"""A decode node that keeps a prefix requests shared (in process: tiny engine, recording endpoint):
its plans say how much of the prompt's KV it holds, it takes only KV for the rest, from that
token on, and every way a request ends lets the held prefix go."""

from __future__ import annotations

import time

from bus.kv import TransferResult
from bus.kv.layout import KVInfo
from bus.kv.stats import TransferStats
from bus.messages import Cancel, Direct
from nodes import wire
from nodes.decode_node import KvArrived
from tests.nodes.cluster_fakes import tiny_engine
from tests.nodes.test_decode_node import make_work, prefilled, request, run_until_idle, streamed

SHARED = list(range(3, 43))    # 40 tokens: 32 of them (2 blocks of 16) can be held


def prompt_of(question):
    return SHARED + [question, question + 1, question + 2]


def warm(work):
    """Two local requests sharing SHARED: the node keeps its leading blocks."""
    for i, question in enumerate((100, 110)):
        work.on_message(request(f"w{i}", prefill="local", prompt_token_ids=prompt_of(question)))
        run_until_idle(work)


def arrive_rest(work, endpoint, request_id, prompt, *, token_offset):
    """The prefill node's side of a remote plan that holds `token_offset` tokens: KV for the rest."""
    transfer_id = endpoint.of("partial", request_id)[0]["transfer_id"]
    kv, first_token_id = prefilled(prompt)
    rest = kv[:, :, :, token_offset:].contiguous()
    dst = work.kv.allocate(transfer_id, request_id, KVInfo(tuple(rest.shape), "float32"), "int8")
    assert dst is not None
    dst.copy_(rest)
    stats = TransferStats(transfer_id, request_id, raw_bytes=rest.nbytes)
    work.on_message(KvArrived(TransferResult(transfer_id, request_id, True, dst, token_offset, "", stats)))
    work.on_message(Direct("prefill-0", wire.to_wire(wire.KvReadyBody(request_id, transfer_id, first_token_id))))
    return transfer_id


def held_pins(work):
    return sum(entry.pins for entry in (work.engine.sessions.get(s) for s in work.engine.sessions.lru_order()))


def test_a_remote_plan_says_what_the_node_holds_and_takes_only_the_rest(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_suffix_tokens=0)
    warm(work)
    prompt = prompt_of(120)
    work.on_message(request("r1", prompt_token_ids=prompt))
    (plan,) = endpoint.of("partial", "r1")
    assert plan["plan"] == "remote" and plan["num_cached_tokens"] == 32 and held_pins(work) == 1
    transfer_id = plan["transfer_id"]
    whole = KVInfo((2, 2, 2, len(prompt), 16), "float32")
    assert work.kv.allocate(transfer_id, "r1", whole, "int8") is None     # the whole KV: not what was planned
    arrive_rest(work, endpoint, "r1", prompt, token_offset=32)
    assert work.jobs["r1"].running and held_pins(work) == 0
    run_until_idle(work)
    final = endpoint.of("final", "r1")[0]
    assert final["stats"]["num_cached_tokens"] == 32 and final["stats"]["node_prefix_reused_tokens"] == 32
    local, local_endpoint, _ = make_work(kv_thread)
    local.on_message(request("l", prefill="local", prompt_token_ids=prompt))
    run_until_idle(local)
    assert streamed(endpoint, "r1") == streamed(local_endpoint, "l")[1:]


def test_kv_from_another_token_offset_is_refused_and_the_request_waits_on(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_suffix_tokens=0)
    warm(work)
    prompt = prompt_of(120)
    work.on_message(request("r1", prompt_token_ids=prompt))
    transfer_id = endpoint.of("partial", "r1")[0]["transfer_id"]
    kv, _ = prefilled(prompt)
    rest = kv[:, :, :, 32:].contiguous()
    dst = work.kv.allocate(transfer_id, "r1", KVInfo(tuple(rest.shape), "float32"), "int8")
    stats = TransferStats(transfer_id, "r1")
    work.on_message(KvArrived(TransferResult(transfer_id, "r1", True, dst, 16, "", stats)))
    assert work.jobs["r1"].waiting and work.counters["kv.wrong_offset"] == 1
    assert work.kv.buffers.num_taken == 0                  # its buffer went back


def test_a_short_rest_is_a_cached_plan_prefilled_here(kv_thread):
    work, endpoint, _ = make_work(kv_thread)              # local_suffix_tokens 64: 11 tokens are short
    warm(work)
    work.on_message(request("r1", prompt_token_ids=prompt_of(120)))
    plan = endpoint.of("partial", "r1")[0]
    assert plan["plan"] == "cached" and plan["num_cached_tokens"] == 32
    run_until_idle(work)
    assert len(streamed(endpoint, "r1")) == 6 and held_pins(work) == 0


def test_a_colocated_node_reuses_a_kept_prefix_too(kv_thread):
    work, endpoint, _ = make_work(kv_thread, always_local=True)
    warm(work)
    work.on_message(request("r1", prompt_token_ids=prompt_of(120)))
    plan = endpoint.of("partial", "r1")[0]
    assert plan["plan"] == "local" and plan["num_cached_tokens"] == 32
    run_until_idle(work)
    assert work.engine.stats.num_prefix_reused_tokens == 32


def test_cancel_timeout_and_refusal_let_the_held_prefix_go(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_suffix_tokens=0, kv_timeout_s=0.01,
                                  engine=tiny_engine(max_num_seqs=1))
    warm(work)
    work.on_message(request("c", prompt_token_ids=prompt_of(120)))
    assert held_pins(work) == 1
    work.on_message(Cancel("c"))
    assert held_pins(work) == 0
    work.on_message(request("t", prompt_token_ids=prompt_of(130)))
    work.on_message(request("f", prompt_token_ids=prompt_of(140)))     # one request at a time: full
    assert endpoint.of("error", "f")[0]["code"] == "full" and held_pins(work) == 1
    time.sleep(0.02)
    work.work(time.monotonic())
    assert endpoint.of("error", "t")[0]["code"] == "kv_timeout" and held_pins(work) == 0


def test_another_tenant_gets_no_held_prefix(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_suffix_tokens=0)
    warm(work)
    work.on_message(request("r1", prompt_token_ids=prompt_of(120), cache_salt="tenant-b"))
    plan = endpoint.of("partial", "r1")[0]
    assert plan["plan"] == "remote" and "num_cached_tokens" not in plan and held_pins(work) == 0


def test_a_busy_node_sends_a_short_rest_to_a_prefill_node(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_prefill_max_running=2)
    warm(work)
    for rid, question in (("a", 120), ("b", 130)):   # the node runs 0, then 1 request: not busy
        work.on_message(request(rid, prompt_token_ids=prompt_of(question)))
    work.on_message(request("c", prompt_token_ids=prompt_of(140)))   # 2 running: busy
    plans = [endpoint.of("partial", rid)[0] for rid in "abc"]
    assert [p["plan"] for p in plans] == ["cached", "cached", "remote"]
    assert plans[2]["num_cached_tokens"] == 32   # still held: the prefill node sends only the rest


def test_pinned_blocks_are_not_counted_as_room_for_new_requests(kv_thread):
    work, endpoint, _ = make_work(kv_thread, local_suffix_tokens=0)
    warm(work)
    before = work.capacity()["kv_blocks_free"]
    work.on_message(request("r1", prompt_token_ids=prompt_of(120)))   # pins the 2-block prefix, reserves 4
    usage = work.engine.kv_usage()
    assert usage.num_pinned_blocks == 2 and usage.num_session_blocks >= 2
    assert work.capacity()["kv_blocks_free"] == before - work.jobs["r1"].num_blocks - 2
    work.on_message(Cancel("r1"))
    assert work.engine.kv_usage().num_pinned_blocks == 0 and work.capacity()["kv_blocks_free"] == before
