"""The prefill side of a node, in process (tiny engine, a recording endpoint): batching, the first
token before the KV, the KV to a real receiver over loopback, cancellation, bad requests."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from bus.kv import KVReceiver
from bus.messages import Cancel, Request
from nodes import wire
from nodes.engines.base import PrefillRequest, SamplingParams
from nodes.prefill_jobs import KvSendDone
from nodes.prefill_node import PrefillWork
from tests.nodes.cluster_fakes import FakeEndpoint, tiny_engine, tiny_settings

GREEDY = wire.to_wire(SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def make_work(kv_thread, **settings):
    work = PrefillWork(tiny_settings("prefill", **settings), tiny_engine(), kv_thread)
    endpoint = FakeEndpoint("prefill-a")
    work.attach(endpoint)
    return work, endpoint


def request(request_id="p1", **body):
    values = {"prompt_token_ids": PROMPT, "sampling": GREEDY, "decode_node_id": "decode-a",
              "data_endpoint": "tcp://127.0.0.1:1", "transfer_id": "t1", "request_id": "d1"}
    values.update(body)
    return Request("prefill", request_id, values)


def take_inbox(work, endpoint, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            message = endpoint.inbox.get(0.05)
        except TimeoutError:
            continue
        work.on_message(message)
        return message
    raise AssertionError("nothing arrived from the KV thread")


def test_first_token_then_kv_then_kv_ready_then_final(kv_thread):
    receiver = KVReceiver()
    data_endpoint = kv_thread.run(receiver.start())
    work, endpoint = make_work(kv_thread)
    work.on_message(request(data_endpoint=data_endpoint))
    assert work.capacity()["queued_tokens"] == len(PROMPT)
    work.work(time.monotonic() + 1)   # past max_wait: the batch runs
    (token,) = endpoint.of("partial", "p1")
    assert token["type"] == "token" and token["index"] == 0 and not endpoint.of("direct")
    assert isinstance(take_inbox(work, endpoint), KvSendDone)
    (ready,) = endpoint.of("direct", "decode-a")
    (final,) = endpoint.of("final", "p1")
    assert ready == wire.to_wire(wire.KvReadyBody("d1", "t1", token["token_id"]))
    assert final["transfer"]["raw_bytes"] == final["transfer"]["wire_bytes"] > 0
    result = kv_thread.run(receiver.result("t1", timeout=5))
    assert result.ok and result.request_id == "d1" and result.kv.shape[3] == len(PROMPT)
    kv_thread.run(receiver.close())
    work.close()


def test_an_unreachable_decode_node_ends_with_kv_failed(kv_thread):
    from bus.kv import SendConfig
    work, endpoint = make_work(kv_thread)
    work.sender.config = SendConfig(ack_timeout=0.05, max_attempts=1, transfer_timeout=0.3)
    work.on_message(request(data_endpoint="tcp://127.0.0.1:9"))
    work.work(time.monotonic() + 1)
    take_inbox(work, endpoint)
    (error,) = endpoint.of("error", "p1")
    assert error["code"] == "kv_failed" and error["transfer_id"] == "t1" and error["node_id"] == "prefill-a"
    assert not endpoint.of("direct")
    work.close()


def test_kv_ready_goes_out_from_the_kv_thread_before_the_node_thread_handles_the_send(kv_thread):
    """The decode node must not wait for this node's next prefill pass to learn its KV is there."""
    receiver = KVReceiver()
    data_endpoint = kv_thread.run(receiver.start())
    work, endpoint = make_work(kv_thread)
    work.on_message(request(data_endpoint=data_endpoint))
    work.work(time.monotonic() + 1)
    deadline = time.monotonic() + 10
    while not endpoint.of("direct") and time.monotonic() < deadline:
        time.sleep(0.01)   # nobody handles the inbox meanwhile: the node thread is "busy"
    (token,) = endpoint.of("partial", "p1")
    assert endpoint.of("direct", "decode-a") == [wire.to_wire(wire.KvReadyBody("d1", "t1", token["token_id"]))]
    assert not endpoint.of("final")
    assert isinstance(take_inbox(work, endpoint), KvSendDone) and len(endpoint.of("direct")) == 1
    assert endpoint.of("final", "p1")
    kv_thread.run(receiver.close())
    work.close()


def test_an_urgent_prefill_runs_before_queued_new_work_and_without_the_batching_wait(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.on_message(request("new", transfer_id="t-new", data_endpoint="tcp://127.0.0.1:9"))
    work.on_message(request("resumed", transfer_id="t-resumed", urgent=True, data_endpoint="tcp://127.0.0.1:9"))
    now = time.monotonic()
    assert work.capacity()["queued_tokens"] == 2 * len(PROMPT)
    assert work.work(now)   # the new prompt still waits for max_wait; the urgent one runs now, alone
    assert [rid for kind, rid, _ in endpoint.sent if kind == "partial"] == ["resumed"]
    assert work.work(now + 1)
    assert [rid for kind, rid, _ in endpoint.sent if kind == "partial"] == ["resumed", "new"]
    for request_id in ("resumed", "new"):
        work.on_message(Cancel(request_id))
    work.close()


def test_every_pass_changes_the_capacity_so_the_scheduler_gets_a_report(kv_thread):
    """An urgent prompt runs the moment it arrives: `queued_tokens` is 0 before and after, so
    only the pass counter makes the capacity differ (the scheduler forgets its routed estimate)."""
    work, endpoint = make_work(kv_thread)
    before = work.capacity()
    work.on_message(request(urgent=True, data_endpoint="tcp://127.0.0.1:9"))
    assert work.work(time.monotonic())
    after = work.capacity()
    assert after["queued_tokens"] == before["queued_tokens"] == 0 and after != before
    assert after["num_prefilled"] == before["num_prefilled"] + 1
    work.on_message(Cancel("p1"))
    work.close()


def test_cancel_drops_a_queued_urgent_prompt(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.on_message(request(urgent=True))
    assert work.on_message(Cancel("p1"))
    assert work.capacity()["queued_tokens"] == 0 and work.next_deadline() is None
    assert not work.work(time.monotonic() + 1) and not endpoint.sent


def test_a_send_that_crashes_fails_the_transfer_instead_of_hanging(kv_thread):
    work, endpoint = make_work(kv_thread)

    async def broken(*args, **kwargs):
        raise ValueError("a bug in the send path")
    work.sender.send = broken
    work.on_message(request())
    work.work(time.monotonic() + 1)
    done = take_inbox(work, endpoint)
    assert isinstance(done, KvSendDone) and done.report is None and "internal" in done.error
    (error,) = endpoint.of("error", "p1")
    assert error["code"] == wire.Code.KV_FAILED and not work.jobs and not endpoint.of("direct")
    work.close()


def test_batcher_waits_for_max_wait_or_the_token_budget(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.on_message(request())
    assert not work.work(time.monotonic() - 1) and work.next_deadline() is not None
    assert not endpoint.of("partial")


def test_cancel_drops_a_queued_prompt(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.on_message(request())
    assert work.on_message(Cancel("p1"))
    assert work.capacity()["queued_tokens"] == 0 and not work.jobs
    assert not work.work(time.monotonic() + 1) and not endpoint.sent


@pytest.mark.parametrize(("body", "message"), [
    ({"prompt_token_ids": []}, "prompt_token_ids"),
    ({"prompt_token_ids": [5] * 4096}, "no room"),
    ({"prompt_token_ids": [10**6]}, "vocabulary"),
    ({"transfer_id": ""}, "transfer_id is required"),
    ({"data_endpoint": None}, "data_endpoint is required"),
    ({"sampling": {"top_p": 0}}, "bad sampling"),
    ({"sampling": {"stop": 5}}, "stop"), ({"decode_node_id": ["d"]}, "decode_node_id is required"),
    ({"urgent": "yes"}, "urgent"), ({"prompt_token_ids": [5, 6.0]}, "prompt_token_ids"),
])
def test_bad_requests_get_a_clear_error_and_queue_nothing(kv_thread, body, message):
    work, endpoint = make_work(kv_thread)
    work.on_message(request(**body))
    (error,) = endpoint.of("error", "p1")
    assert error["code"] == "bad_request" and message in error["message"]
    assert work.capacity()["queued_tokens"] == 0 and not work.jobs


def test_cancel_while_the_kv_is_in_flight_aborts_the_send(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.on_message(request(data_endpoint="tcp://127.0.0.1:9"))   # nobody acknowledges: stays in flight
    work.work(time.monotonic() + 1)
    assert work.jobs["p1"].sending
    assert work.on_message(Cancel("p1"))
    done = take_inbox(work, endpoint)   # ended by the abort, not by the ACK timeout (its reason says so)
    assert isinstance(done, KvSendDone) and done.report is None and "cancel" in done.error
    assert not work.jobs and not endpoint.of("direct") and not endpoint.of("error") and not endpoint.of("final")
    work.close()


def partial_ids(endpoint):
    return [rid for kind, rid, _ in endpoint.sent if kind == "partial"]


def test_an_urgent_prefill_interrupts_a_running_pass_between_chunks(kv_thread):
    """New work runs in chunks; a recovery arriving mid-pass runs next, then the pass resumes from
    its KV so far and ends with the same first token and KV as one uninterrupted pass."""
    work, endpoint = make_work(kv_thread)
    work.chunk_tokens = 3
    long_prompt = list(range(20, 30))
    reference = work.engine.prefill([wire_request(work, "ref", long_prompt)])[0]
    work.on_message(request("new", prompt_token_ids=long_prompt, transfer_id="t-new",
                            data_endpoint="tcp://127.0.0.1:9"))
    now = time.monotonic() + 1
    assert work.work(now) and not partial_ids(endpoint)   # 3 of 10 tokens done
    assert work.capacity()["queued_tokens"] == 7
    work.on_message(request("resumed", prompt_token_ids=[5, 6, 7], transfer_id="t-resumed", urgent=True,
                            data_endpoint="tcp://127.0.0.1:9"))
    assert work.capacity()["queued_tokens"] == 10
    assert work.work(now) and partial_ids(endpoint) == ["resumed"]   # one chunk, before the rest of "new"
    for _ in range(3):
        assert work.work(now)
    assert partial_ids(endpoint) == ["resumed", "new"] and not work.passes and not work.work(now)
    (token,) = endpoint.of("partial", "new")
    assert token["token_id"] == reference.first_token_id
    assert work.capacity()["num_prefilled"] == 2 and work.capacity()["queued_tokens"] == 0
    for request_id in ("resumed", "new"):
        work.on_message(Cancel(request_id))
    work.close()


def keep_sends(work) -> dict:
    """Replace the KV send by one that only records the KV (request id -> tensor)."""
    sent = {}

    def record(job, kv):
        sent[job.request_id] = kv
        return asyncio.sleep(0)   # the coroutine the KV thread runs
    work._send = record
    return sent


def wire_request(work, request_id, prompt):
    from nodes.engines.base import PrefillRequest
    return PrefillRequest(request_id, tuple(prompt), wire.from_wire(wire.SamplingParams, GREEDY))


def test_the_interrupted_pass_keeps_its_kv_and_recomputes_nothing(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.chunk_tokens = 4
    long_prompt = list(range(20, 32))
    reference = work.engine.prefill([wire_request(work, "ref", long_prompt)])[0]
    sent_kv = keep_sends(work)
    work.on_message(request("new", prompt_token_ids=long_prompt, transfer_id="t-new"))
    now = time.monotonic() + 1
    work.work(now)
    work.on_message(request("resumed", prompt_token_ids=PROMPT, transfer_id="t-resumed", urgent=True))
    before = work.engine.stats.num_prefilled_tokens
    while work.work(now):
        pass
    assert work.engine.stats.num_prefilled_tokens - before == len(long_prompt) - 4 + len(PROMPT)
    assert torch.allclose(sent_kv["new"], reference.kv, atol=1e-6, rtol=0)
    assert partial_ids(endpoint) == ["resumed", "new"]


def test_cancel_stops_a_prompt_inside_a_running_pass(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.chunk_tokens = 4
    work.on_message(request("p1", prompt_token_ids=list(range(20, 32))))
    now = time.monotonic() + 1
    assert work.work(now)
    assert work.on_message(Cancel("p1"))
    assert work.capacity()["queued_tokens"] == 0 and not work.jobs
    assert work.work(now) and not work.passes and not work.work(now)
    assert not endpoint.of("partial")


def test_an_urgent_pass_runs_whole_and_urgent_prompts_keep_their_order(kv_thread):
    work, endpoint = make_work(kv_thread)
    work.chunk_tokens = 4
    keep_sends(work)
    work.on_message(request("new", prompt_token_ids=list(range(20, 32))))
    work.on_message(request("u1", prompt_token_ids=list(range(20, 28)), urgent=True))
    now = time.monotonic() + 1
    assert work.work(now) and partial_ids(endpoint) == ["u1"]   # 8 tokens in one step, not two chunks
    work.on_message(request("u2", prompt_token_ids=[5, 6], urgent=True))
    assert work.work(now) and partial_ids(endpoint) == ["u1", "u2"]
    assert work.work(now) and work.passes and work.passes[-1].prefill.num_remaining_tokens == 8


def test_the_kv_sender_takes_the_configured_link_speed_and_chunk_size(kv_thread):
    from bus.kv.layout import DEFAULT_CHUNK_BYTES
    from bus.kv.link import gbit
    work, _ = make_work(kv_thread, kv_link_gbit=2.5, kv_chunk_mib=1.5)
    assert (work.sender.auto.link_bytes_per_s, work.sender.chunk_bytes) == (gbit(2.5), 3 * 2**19)
    work, _ = make_work(kv_thread, kv_link_gbit=10.0)   # chunk_mib "auto"
    assert work.sender.chunk_bytes == DEFAULT_CHUNK_BYTES


def test_a_prompt_prefix_cached_under_its_salt_is_not_prefilled_again(kv_thread):
    """Two requests with one 40-token prompt under one salt: the second takes its two full blocks
    from the prefix cache (the FINAL says how many tokens); under another salt, nothing is shared."""
    receiver = KVReceiver()
    data_endpoint = kv_thread.run(receiver.start())
    work, endpoint = make_work(kv_thread)
    prompt = list(range(20, 60))
    finals = []
    for i, salt in enumerate(("tenant-a", "tenant-a", "tenant-b")):
        body = request(f"p{i}", prompt_token_ids=prompt, transfer_id=f"t{i}", data_endpoint=data_endpoint,
                       cache_salt=salt).body | {"request_id": f"d{i}"}
        work.on_message(Request("prefill", f"p{i}", body))
        work.work(time.monotonic() + 1)
        take_inbox(work, endpoint)
        (final,) = endpoint.of("final", f"p{i}")
        finals.append(final)
        assert kv_thread.run(receiver.result(f"t{i}", timeout=5)).kv.shape[3] == len(prompt)
    assert [f["stats"]["num_cached_tokens"] for f in finals] == [0, 32, 0]
    assert finals[2]["stats"]["num_prefix_cached_tokens"] == 32
    capacity = work.capacity()   # what the broker's stats pass on to the gateway's /metrics
    assert (capacity["prompt_tokens"], capacity["prefix_cached_tokens"]) == (3 * len(prompt), 32)
    tokens = [endpoint.of("partial", f"p{i}")[0]["token_id"] for i in range(3)]
    assert tokens[0] == tokens[1] == tokens[2]   # a hit changes nothing in what is sent
    kv_thread.run(receiver.close())
    work.close()


def test_a_kv_offset_sends_only_the_rest_of_the_prompt_from_that_token(kv_thread):
    """The decode node holds the first 4 tokens' KV: the transfer carries the other 4, marked as
    starting at token 4, and equals that part of the whole KV."""
    receiver = KVReceiver()
    data_endpoint = kv_thread.run(receiver.start())
    work, endpoint = make_work(kv_thread, kv_quant="raw")
    work.on_message(request(data_endpoint=data_endpoint, kv_offset=4))
    work.work(time.monotonic() + 1)
    take_inbox(work, endpoint)
    (final,) = endpoint.of("final", "p1")
    result = kv_thread.run(receiver.result("t1", timeout=5))
    assert result.ok and result.token_offset == 4 and result.kv.shape[3] == len(PROMPT) - 4
    [whole] = tiny_engine().prefill([PrefillRequest("w", tuple(PROMPT), SamplingParams(temperature=0.0, max_tokens=6))])
    whole = whole.kv
    assert torch.equal(torch.from_numpy(result.kv), whole[:, :, :, 4:])
    assert final["transfer"]["raw_bytes"] == whole[:, :, :, 4:].nbytes
    kv_thread.run(receiver.close())
    work.close()


def test_the_capacity_reports_the_prefixes_the_cache_holds_as_the_routing_key_names_them(kv_thread):
    from scheduler.prefill_keys import parse_prefill_key, prefill_key

    receiver = KVReceiver()
    data_endpoint = kv_thread.run(receiver.start())
    work, endpoint = make_work(kv_thread)
    assert not any(name.startswith("px.") for name in work.capacity())
    prompt = list(range(20, 60))   # 2 full blocks of 16: depths 1 and 2
    work.on_message(request(prompt_token_ids=prompt, data_endpoint=data_endpoint, cache_salt="tenant-a"))
    work.work(time.monotonic() + 1)
    take_inbox(work, endpoint)
    reported = {name: value for name, value in work.capacity().items() if name.startswith("px.")}
    hashes = parse_prefill_key(prefill_key(prompt, "tenant-a")).hashes
    assert reported == {f"px.{hashes[0]}": 16, f"px.{hashes[1]}": 32}
    kv_thread.run(receiver.close())
    work.close()
