"""A prefill node whose engine encodes KV on its device (`[kv] device_codec`): the send starts as the
export begins, inside the pass, and chunks leave while later chunks of the prompt compute; the
decode side receives what the CPU codec's path sends; a cancel inside the pass fails the waiting
send at once and stops computing the prompt; a prompt whose head the decode node holds waits for
the end of the pass; a send done before the first token waits for it to send kv_ready, and tells
nobody if the request is gone."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from bus.kv import KVReceiver
from bus.messages import Cancel
from nodes import wire
from nodes.engines.kv_export import DeviceExport
from nodes.prefill_jobs import KvSendDone
from nodes.prefill_node import PrefillWork
from tests.nodes.cluster_fakes import FakeEndpoint, tiny_engine, tiny_settings
from tests.nodes.test_prefill_node import request, take_inbox

PROMPT = list(range(20, 60))


def make_work(kv_thread, device_codec: bool, **settings):
    engine = tiny_engine(kv_export="int8" if device_codec else "")
    work = PrefillWork(tiny_settings("prefill", kv_quant="int8", **settings), engine, kv_thread)
    work.attach(endpoint := FakeEndpoint("prefill-a"))
    work.chunk_tokens = 8   # a pass of five chunks
    return work, endpoint


def asked(kv_thread, device_codec: bool):
    """A receiver, and a prefill node asked for PROMPT's KV to go to it."""
    receiver = KVReceiver()
    work, endpoint = make_work(kv_thread, device_codec)
    work.on_message(request(data_endpoint=kv_thread.run(receiver.start()), prompt_token_ids=PROMPT))
    return receiver, work, endpoint


def received(kv_thread, device_codec: bool, **body) -> tuple[np.ndarray, dict, list]:
    receiver = KVReceiver()
    work, endpoint = make_work(kv_thread, device_codec)
    work.on_message(request(data_endpoint=kv_thread.run(receiver.start()), prompt_token_ids=PROMPT, **body))
    now = time.monotonic() + 1
    assert work.work(now)   # the first chunk
    job = work.jobs["p1"]
    started_inside = job.sending and isinstance(job.export, DeviceExport)
    assert started_inside == (device_codec and not body.get("kv_offset"))
    while work.passes:
        work.work(now)
    assert isinstance(take_inbox(work, endpoint), KvSendDone)
    (final,) = endpoint.of("final", "p1")
    kinds = [kind for kind, _, _ in endpoint.sent]
    assert kinds.index("partial") < kinds.index("direct")   # the first token, then kv_ready
    result = kv_thread.run(receiver.result("t1", timeout=5))
    assert result.ok
    kv_thread.run(receiver.close())
    work.close()
    return result.kv, final, endpoint.of("direct", "decode-a")


def test_the_send_starts_inside_the_pass_and_delivers_the_cpu_codecs_kv(kv_thread):
    kv, final, ready = received(kv_thread, device_codec=True)
    expected, expected_final, expected_ready = received(kv_thread, device_codec=False)
    assert np.array_equal(kv, expected) and kv.shape[3] == len(PROMPT)
    assert ready == expected_ready and len(ready) == 1   # kv_ready names the first token, sent after it
    assert final["token"] == expected_final["token"]
    assert final["transfer"]["wire_bytes"] == expected_final["transfer"]["wire_bytes"]


def test_a_held_head_is_cut_from_the_export_once_the_pass_ends(kv_thread):
    kv, _, _ = received(kv_thread, device_codec=True, kv_offset=16)
    expected, _, _ = received(kv_thread, device_codec=False, kv_offset=16)
    assert np.array_equal(kv, expected) and kv.shape[3] == len(PROMPT) - 16


def test_a_cancel_inside_the_pass_fails_the_waiting_send_at_once(kv_thread):
    receiver, work, endpoint = asked(kv_thread, device_codec=True)
    assert work.work(time.monotonic() + 1)
    export = work.jobs["p1"].export
    started = time.monotonic()
    assert work.on_message(Cancel("p1"))
    done = take_inbox(work, endpoint)
    assert isinstance(done, KvSendDone) and done.report is None and time.monotonic() - started < 5
    assert export.cancelled and not work.jobs and not endpoint.of("direct") and not endpoint.of("final")
    (running,) = work.passes   # the prompt left the pass too: its remaining chunks are not computed
    assert running.prefill.done and running.prefill.num_remaining_tokens == 0
    kv_thread.run(receiver.close())
    work.close()


def test_a_send_done_before_the_first_token_waits_for_it_then_sends_kv_ready(kv_thread):
    receiver, work, endpoint = asked(kv_thread, device_codec=False)
    job = work.jobs["p1"]
    kv = torch.randn(2, 2, 2, len(PROMPT), 16)   # the tiny model's layout: what the pass would export
    sending = kv_thread.submit(work._send(job, kv))
    assert kv_thread.run(receiver.result("t1", timeout=5)).ok
    time.sleep(0.05)
    assert not sending.done() and not endpoint.of("direct")   # the KV landed; kv_ready waits for the token
    job.first_token = wire.TokenBody(0, 7, "x", None)
    sending.result(timeout=5)
    (ready,) = endpoint.of("direct", "decode-a")
    assert ready["first_token_id"] == 7 and isinstance(take_inbox(work, endpoint), KvSendDone)
    kv_thread.run(receiver.close())
    work.close()


def test_a_send_whose_request_was_released_before_its_first_token_tells_nobody(kv_thread):
    receiver, work, endpoint = asked(kv_thread, device_codec=False)
    job = work.jobs.pop("p1")   # released (cancelled, its pass failed) while its KV was on the way
    kv_thread.run(work._send(job, torch.randn(2, 2, 2, len(PROMPT), 16)), timeout=10)
    assert not endpoint.of("direct")
    with pytest.raises(AssertionError, match="nothing arrived"):
        take_inbox(work, endpoint, timeout=0.2)
    kv_thread.run(receiver.close())
    work.close()
