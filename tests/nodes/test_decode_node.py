"""The decode side of a node, in process (tiny engine, a recording endpoint, no sockets): plans,
refusals, streaming, cancellation, KV that never arrives, bad requests, and the reused buffers
received KV lands in."""

from __future__ import annotations

import time

import pytest
import torch

from bus.kv import RawPieces, TransferResult
from bus.kv.layout import KVInfo
from bus.kv.stats import TransferStats
from bus.messages import Cancel, Direct, Request
from nodes import wire
from nodes.decode_node import DecodeWork, KvArrived
from nodes.engines.base import PrefillRequest, SamplingParams
from tests.nodes.cluster_fakes import FakeEndpoint, tiny_engine, tiny_settings
from tests.nodes.engines.engine_helpers import raw_pieces

GREEDY = wire.to_wire(SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def make_work(kv_thread, *, always_local=False, engine=None, **settings):
    work = DecodeWork(tiny_settings("decode", **settings), engine or tiny_engine(), kv_thread, always_local=always_local)
    endpoint = FakeEndpoint()
    work.attach(endpoint)
    published = []
    work.publish_capacity = lambda: published.append(work.capacity())
    return work, endpoint, published


def request(request_id="r1", **body):
    values = {"prompt_token_ids": PROMPT, "sampling": GREEDY, "session_id": None, "prefill": "auto", "resume": None}
    values.update(body)
    return Request("decode", request_id, values)


def run_until_idle(work, limit=1000):
    for _ in range(limit):
        if not work.work(time.monotonic()):
            return
    raise AssertionError("decode work did not go idle")


def test_remote_plan_reserves_blocks_until_the_kv_arrives(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    free = work.capacity()["kv_blocks_free"]
    assert work.on_message(request())
    (plan,) = endpoint.of("partial", "r1")
    assert plan["plan"] == "remote" and plan["transfer_id"] and plan["data_endpoint"] == endpoint.core.data_endpoint
    assert work.capacity()["kv_blocks_free"] < free and work.capacity()["num_running"] == 1
    assert work.on_message(Cancel("r1"))
    assert work.capacity()["kv_blocks_free"] == free and work.capacity()["num_running"] == 0


def test_local_plan_streams_every_token_then_a_final_with_them(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request(prefill="local"))
    run_until_idle(work)
    plan, *tokens = endpoint.of("partial", "r1")
    (final,) = endpoint.of("final", "r1")
    assert plan["plan"] == "local" and [t["index"] for t in tokens] == list(range(6))
    assert [t[1] for t in final["tokens"]] == [t["token_id"] for t in tokens]
    assert final["finish_reason"] == "length" and final["usage"] == {"prompt_tokens": 8, "completion_tokens": 6}


def test_a_step_sends_its_streams_tokens_as_one_batch_then_the_finals(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    for request_id in ("r1", "r2", "r3"):
        work.on_message(request(request_id, prefill="local"))
    run_until_idle(work)
    assert endpoint.num_batches == 6   # 6 steps of 3 streams: one hand-over each, not 18
    kinds = [(kind, rid) for kind, rid, _ in endpoint.sent if kind != "capacity"]
    assert kinds[-3:] == [("final", "r1"), ("final", "r2"), ("final", "r3")]   # after their last tokens


def test_the_final_repeats_only_the_tokens_a_lost_broker_may_not_have_forwarded(kv_thread, monkeypatch):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request(prefill="local"))
    clock = (0.3 * i for i in range(1000))   # 0.3 s a call: early tokens leave the 1 s replay window
    monkeypatch.setattr("nodes.decode_node.time.monotonic", lambda: float(next(clock)))
    run_until_idle(work)
    tokens = endpoint.of("partial", "r1")[1:]
    (final,) = endpoint.of("final", "r1")
    assert 0 < len(final["tokens"]) < len(tokens) == 6
    assert [t[0] for t in final["tokens"]] == [t["index"] for t in tokens[-len(final["tokens"]):]]
    assert final["usage"]["completion_tokens"] == 6


def test_colocated_always_plans_local(kv_thread):
    work, endpoint, _ = make_work(kv_thread, always_local=True)
    work.on_message(request(prefill="auto"))
    assert endpoint.of("partial", "r1")[0]["plan"] == "local"


def test_full_node_publishes_capacity_then_answers_full(kv_thread):
    work, endpoint, published = make_work(kv_thread, engine=tiny_engine(num_kv_blocks=1, block_size=16))
    work.on_message(request("r1"))   # takes the only block while its KV is awaited
    work.on_message(request("r2"))
    (error,) = endpoint.of("error", "r2")
    assert error["code"] == "full" and error["node_id"] == "node-a"
    assert published[-1]["kv_blocks_free"] == 0


def test_refused_full_is_reported_in_capacity_until_the_blocks_are_back(kv_thread):
    # Without the flag the scheduler would send the client's retries back here until they ran out;
    # with it the broker queues new requests until this node has room again.
    work, endpoint, published = make_work(kv_thread, engine=tiny_engine(num_kv_blocks=1, block_size=16))
    work.on_message(request("r1"))
    work.on_message(request("r2"))
    assert published[-1]["full"] == 1
    assert work.on_message(Cancel("r1"))
    assert work.capacity()["full"] == 0 and work.capacity()["kv_blocks_free"] == 1


def test_too_long_a_request_is_rejected_not_full(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1", prompt_token_ids=[5] * 4096))            # beyond the context
    work.on_message(request("r2", prompt_token_ids=[10**6], prefill="local"))  # outside the vocabulary
    assert endpoint.of("error", "r1")[0]["code"] == "rejected" and "context" in endpoint.of("error", "r1")[0]["message"]
    assert endpoint.of("error", "r2")[0]["code"] == "rejected" and "vocabulary" in endpoint.of("error", "r2")[0]["message"]
    assert not work.jobs


@pytest.mark.parametrize(("body", "message"), [
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt_token_ids": "abc"}, "prompt_token_ids"),
    ({"prefill": "sometimes"}, "prefill must be"),
    ({"sampling": {"temperature": -1}}, "bad sampling"),
    ({"sampling": "greedy"}, "sampling must be a map"),
    ({"prompt_token_ids": [True, 5]}, "prompt_token_ids"), ({"session_id": [1]}, "session_id"),
    ({"session_id": "s" * 129}, "session_id"), ({"resume": "yes"}, "resume"),
    ({"sampling": {"stop": [1]}}, "stop"), ({"sampling": {"max_tokens": 2.5}}, "max_tokens"),
    ({"sampling": {"temperature": float("nan")}}, "temperature"), ({"sampling": {"seed": 2**64}}, "seed"),
])
def test_bad_requests_get_a_clear_error_and_change_nothing(kv_thread, body, message):
    work, endpoint, _ = make_work(kv_thread)
    before = work.capacity()
    work.on_message(request(**body))
    (error,) = endpoint.of("error", "r1")
    assert error["code"] == "bad_request" and message in error["message"]
    assert work.capacity() == before and not work.jobs


def test_non_map_body_is_a_bad_request(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(Request("decode", "r1", [1, 2, 3]))
    assert endpoint.of("error", "r1")[0]["code"] == "bad_request"


def test_kv_that_never_arrives_is_freed_with_kv_timeout(kv_thread):
    work, endpoint, _ = make_work(kv_thread, kv_timeout_s=0.0)
    free = work.capacity()["kv_blocks_free"]
    work.on_message(request())
    work.work(time.monotonic() + 1)
    assert endpoint.of("error", "r1")[0]["code"] == "kv_timeout"
    assert work.capacity()["kv_blocks_free"] == free


def test_kv_ready_without_verified_kv_starts_nothing(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request())
    transfer_id = endpoint.of("partial", "r1")[0]["transfer_id"]
    assert work.on_message(Direct("prefill-0", wire.to_wire(wire.KvReadyBody("r1", transfer_id, 3))))
    assert not work.jobs["r1"].running and not work.engine.has_unfinished()


def test_cached_plan_for_a_short_follow_up_turn(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("t1", prefill="local", session_id="s"))
    run_until_idle(work)
    output = [t[1] for t in endpoint.of("final", "t1")[0]["tokens"]]
    work.on_message(request("t2", session_id="s", prompt_token_ids=PROMPT + output + [20, 21]))
    plan = endpoint.of("partial", "t2")[0]
    assert plan["plan"] == "cached" and plan["num_cached_tokens"] == len(PROMPT) + len(output) - 1


def test_finished_sessions_count_as_available_kv_not_as_full(kv_thread):
    engine = tiny_engine(num_kv_blocks=2, block_size=16)
    work, endpoint, _ = make_work(kv_thread, engine=engine)
    work.on_message(request("t1", prefill="local", session_id="old"))
    run_until_idle(work)
    usage = engine.kv_usage()
    assert usage.num_session_blocks == 1 and usage.num_free_blocks == 1   # the finished session holds a block
    assert work.capacity()["kv_blocks_free"] == 2 and work.capacity()["kv_blocks_cached"] == 1
    work.on_message(request("r1"))   # needs one block: there is one free
    work.on_message(request("r2", session_id="other"))   # needs the session's block: evictable
    assert [p["plan"] for p in endpoint.of("partial", "r1") + endpoint.of("partial", "r2")] == ["remote", "remote"]
    work.on_message(request("r3"))   # nothing left to evict: full
    assert endpoint.of("error", "r3")[0]["code"] == "full"


# -- received KV in reused buffers (nodes/kv_buffers.py) -------------------------------------
def prefilled(prompt):
    """The prompt's KV and first token from another engine on the same weights (a prefill node)."""
    result = tiny_engine().prefill([PrefillRequest("p", tuple(prompt), wire.from_wire(wire.SamplingParams, GREEDY))])[0]
    return result.kv, result.first_token_id


def arrive(work, endpoint, request_id, prompt, *, ready=True):
    """What the KV thread and the prefill node do for a remote plan: the KV lands in the buffer
    the node allocated, the verified result is posted, then (optionally) kv_ready."""
    transfer_id = endpoint.of("partial", request_id)[0]["transfer_id"]
    kv, first_token_id = prefilled(prompt)
    dst = work.kv.allocate(transfer_id, request_id, KVInfo(tuple(kv.shape), "float32"), "int8")
    dst.copy_(kv)
    stats = TransferStats(transfer_id, request_id, raw_bytes=kv.nbytes)
    work.on_message(KvArrived(TransferResult(transfer_id, request_id, True, dst, 0, "", stats)))
    if ready:
        work.on_message(Direct("prefill-0", wire.to_wire(wire.KvReadyBody(request_id, transfer_id, first_token_id))))
    return dst


def streamed(endpoint, request_id):
    return [t[1] for t in endpoint.of("final", request_id)[0]["tokens"]]


def test_received_kv_buffers_are_reused_once_the_engine_copied_them_and_texts_stay_exact(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    local, local_endpoint, _ = make_work(kv_thread)
    second = PROMPT[::-1]
    for rid, prompt in (("l1", PROMPT), ("l2", second)):
        local.on_message(request(rid, prefill="local", prompt_token_ids=prompt))
    run_until_idle(local)
    work.on_message(request("r1"))
    first_buffer = arrive(work, endpoint, "r1", PROMPT)
    assert work.jobs["r1"].running and work.kv.buffers.num_taken == 0 and work.kv.buffers.num_free == 1
    work.work(time.monotonic())                  # r1 decodes a token, then r2's KV reuses r1's buffer
    work.on_message(request("r2", prompt_token_ids=second))
    assert arrive(work, endpoint, "r2", second).data_ptr() == first_buffer.data_ptr()
    (r1,) = [seq for seq in work.engine.running if seq.request_id == "r1"]
    assert torch.equal(work.engine.slots.view(r1.slot)[:, :, :, :len(PROMPT)], prefilled(PROMPT)[0])
    run_until_idle(work)
    # the prefill node streamed the first token; this node the rest, as a local run does
    assert streamed(endpoint, "r1") == streamed(local_endpoint, "l1")[1:]
    assert streamed(endpoint, "r2") == streamed(local_endpoint, "l2")[1:]
    assert work.kv.buffers.num_allocated == 1 and work.kv.buffers.num_taken == 0


def test_received_kv_goes_back_when_nobody_will_decode_from_it(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1"))
    arrive(work, endpoint, "r1", PROMPT, ready=False)     # verified, but kv_ready not here yet
    assert work.kv.buffers.num_taken == 1
    work.on_message(Cancel("r1"))                         # the client gave up meanwhile
    assert work.kv.buffers.num_taken == 0
    work.on_message(request("r2"))
    transfer_id = endpoint.of("partial", "r2")[0]["transfer_id"]
    dst = work.kv.allocate(transfer_id, "r2", KVInfo((2, 2, 2, len(PROMPT), 16), "float32"), "int8")
    work.jobs.pop("r2")                                   # the request is gone when its KV arrives
    work.on_message(KvArrived(TransferResult(transfer_id, "r2", True, dst, 0, "", TransferStats(transfer_id, "r2"))))
    assert work.kv.buffers.num_taken == 0


def test_raw_kv_is_kept_as_its_frames_copied_once_by_the_engine_and_then_let_go(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    local, local_endpoint, _ = make_work(kv_thread)
    local.on_message(request("l1", prefill="local"))
    run_until_idle(local)
    work.on_message(request("r1"))
    transfer_id = endpoint.of("partial", "r1")[0]["transfer_id"]
    kv, first_token_id = prefilled(PROMPT)
    pieces = work.kv.allocate(transfer_id, "r1", KVInfo(tuple(kv.shape), "float32"), "raw")
    assert isinstance(pieces, RawPieces) and work.kv.buffers.num_allocated == 0   # no receive buffer
    for spec, payload in raw_pieces(kv, 1024).pieces():
        pieces.keep(spec, payload)
    stats = TransferStats(transfer_id, "r1", raw_bytes=kv.nbytes)
    work.on_message(KvArrived(TransferResult(transfer_id, "r1", True, pieces, 0, "", stats)))
    work.on_message(Direct("prefill-0", wire.to_wire(wire.KvReadyBody("r1", transfer_id, first_token_id))))
    assert work.jobs["r1"].running and pieces.num_pieces == 0   # the engine copied them; the frames are let go
    run_until_idle(work)
    assert streamed(endpoint, "r1") == streamed(local_endpoint, "l1")[1:]
    assert work.kv.buffers.num_allocated == 0


def test_a_quiet_node_gives_the_buffers_it_kept_for_reuse_back_but_the_last_small_one(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.kv.buffers.give(work.kv.buffers.take((4, 1 << 18), torch.float32))   # an older, bigger one
    work.on_message(request("r1"))
    arrive(work, endpoint, "r1", PROMPT)
    run_until_idle(work)
    assert work.kv.buffers.num_free == 2
    work.on_idle()                                        # what the node loop calls before a heap trim
    assert work.kv.buffers.num_free == 1 and work.kv.buffers.num_taken == 0   # for the next request
    assert work.capacity()["kv_mib_buffers"] == round(work.kv.buffers.num_free_bytes / 2**20, 1)
    work.on_message(request("r3"))
    arrive(work, endpoint, "r3", PROMPT)
    run_until_idle(work)
    assert work.kv.buffers.num_allocated == 2                # r3 received into the kept one


def test_a_failed_receive_hands_its_buffer_back(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1"))
    transfer_id = endpoint.of("partial", "r1")[0]["transfer_id"]
    kv, _ = prefilled(PROMPT)
    dst = work.kv.allocate(transfer_id, "r1", KVInfo(tuple(kv.shape), "float32"), "int8")
    work.kv.receiver.core.release(transfer_id, dst)          # what ReceiverCore does when it fails closed
    assert work.kv.buffers.num_taken == 0 and work.kv.buffers.num_free == 1


def test_a_kv_shape_the_model_does_not_have_gets_no_buffer(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1"))
    transfer_id = endpoint.of("partial", "r1")[0]["transfer_id"]
    assert work.kv.allocate(transfer_id, "r1", KVInfo((1, 2, 1, len(PROMPT), 4), "float32"), "raw") is None
    assert work.kv.buffers.num_taken == 0


def test_prepare_reserves_the_kv_memory_before_any_request_and_a_quiet_node_keeps_it(kv_thread):
    work, _, _ = make_work(kv_thread, always_local=True)
    slots = work.engine.slots
    assert slots.num_bytes == 0
    work.prepare()                                         # what run_node calls before READY
    config = work.engine.config
    assert slots.num_store_tokens == config.num_kv_blocks * config.block_size
    assert work.capacity()["kv_mib_slots"] == pytest.approx(slots.num_bytes / 2**20, abs=0.1)
    work.on_idle()
    assert slots.num_store_tokens == config.num_kv_blocks * config.block_size   # the reserve is not a cache
