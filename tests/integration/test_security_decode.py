"""A real decode node's KV receiver with CURVE on (tiny engine, recording bus endpoint): KV is taken
only for a request this node planned as remote and is waiting for; forged transfers are refused
before a byte is written, counted, and never decoded from."""

from __future__ import annotations

import time

import pytest
import torch

from bus.kv import KVSender, KVTransferFailed, SendConfig
from bus.messages import Direct
from nodes import wire
from nodes.engines.kv_quant import TorchQuantizer
from tests.bus.security_helpers import config_for, make_keys
from tests.nodes.test_decode_node import PROMPT, make_work, request

pytestmark = pytest.mark.integration


@pytest.fixture
def secured(tmp_path):
    from nodes.loop_thread import LoopThread

    keys = make_keys(tmp_path)
    kv_thread = LoopThread("kv-security-test")
    work, endpoint, _ = make_work(kv_thread, security=config_for(keys, tmp_path, "decode"))
    endpoint.core.data_endpoint = work.prepare()
    yield work, endpoint, kv_thread, config_for(keys, tmp_path, "prefill")
    work.close()
    kv_thread.stop()


def _send(kv_thread, security, endpoint, transfer_id, request_id, kv):
    async def send():
        sender = KVSender(quantizer=TorchQuantizer(compile=False), security=security,
                          config=SendConfig(ack_timeout=0.3, transfer_timeout=3.0))
        try:
            return await sender.send(endpoint, transfer_id, request_id, kv, mode="raw", compression="none")
        finally:
            await sender.close()
    return kv_thread.run(send(), timeout=10)


def _take_inbox(work, endpoint, until: float = 2.0) -> None:
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        try:
            work.on_message(endpoint.inbox.get(0.05))
        except TimeoutError:
            if not work.jobs:
                return


def test_forged_transfers_are_refused_counted_and_never_decoded(secured):
    work, endpoint, kv_thread, prefill = secured
    assert work.on_message(request("r1"))
    (plan,) = endpoint.of("partial", "r1")
    assert plan["plan"] == "remote" and ";curve=" in plan["data_endpoint"]
    kv = work.engine.runner.new_kv(len(PROMPT))
    torch.nn.init.normal_(kv)
    # Unassigned request: nobody planned it.
    with pytest.raises(KVTransferFailed, match="no destination"):
        _send(kv_thread, prefill, plan["data_endpoint"], "forged-1", "r-unassigned", kv)
    # The planned request, but KV of another prompt's shape.
    wrong = work.engine.runner.new_kv(len(PROMPT) + 3)
    with pytest.raises(KVTransferFailed, match="no destination"):
        _send(kv_thread, prefill, plan["data_endpoint"], "forged-2", "r1", wrong)
    assert work.kv.receiver.metrics["refused.no_destination"] == 2
    _take_inbox(work, endpoint, until=0.3)
    assert work.jobs["r1"].arrived == {} and not work.jobs["r1"].running   # still waiting, untouched
    # The real transfer, then its kv_ready over the (authenticated) control plane: decoding starts.
    assert _send(kv_thread, prefill, plan["data_endpoint"], plan["transfer_id"], "r1", kv).ok
    work.on_message(Direct("prefill-1", wire.to_wire(wire.KvReadyBody("r1", plan["transfer_id"], 7))))
    _take_inbox(work, endpoint)
    assert "r1" not in work.jobs or work.jobs["r1"].running


def test_a_kv_ready_alone_never_starts_decoding(secured):
    work, endpoint, _, _ = secured
    assert work.on_message(request("r1"))
    (plan,) = endpoint.of("partial", "r1")
    work.on_message(Direct("someone", wire.to_wire(wire.KvReadyBody("r1", plan["transfer_id"], 7))))
    work.on_message(Direct("someone", wire.to_wire(wire.KvReadyBody("r1", "made-up", 7))))
    assert not work.jobs["r1"].running and not work.engine.has_unfinished()


# -- a real decode node process and a hostile peer admitted as `prefill` ----------------------------
MALFORMED_DECODE_BODIES = [
    [1, 2, 3],
    {"prompt_token_ids": [True, 5]},
    {"prompt_token_ids": [5, 6], "session_id": [1]},
    {"prompt_token_ids": [5, 6], "session_id": "s" * 200},
    {"prompt_token_ids": [5, 6], "sampling": {"stop": 5}},
    {"prompt_token_ids": [5, 6], "sampling": {"stop": [1]}, "prefill": "local"},
    {"prompt_token_ids": [5, 6], "sampling": {"max_tokens": 2.5}},
    {"prompt_token_ids": [5, 6], "sampling": {"seed": 2**64 - 1, "temperature": float("nan")}},
    {"prompt_token_ids": [5, 6], "sampling": {"stop_token_ids": [[1]]}},
    {"prompt_token_ids": [5, 6], "resume": "yes"},
    {"prompt_token_ids": [5, 6], "sampling": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]},
]
HOSTILE_KV_READY_FIELDS = [{"first_token_id": 10**6}, {"first_token_id": -1}, {"first_token_id": 2**63},
                           {"first_token_id": "7"}, {"first_token_id": 3.5}, {"first_token_id": None},
                           {"request_id": 5}, {"transfer_id": ["x"]}]


def _refused_code(rogue, body) -> str:
    from bus.mailbox import BusError

    stream = rogue.request(wire.DECODE, body, key="rogue", timeout=20)
    try:
        next(stream)   # a plan: the node took the body
    except BusError as exc:
        return exc.code
    stream.cancel()
    return "served"


def test_a_decode_node_process_outlives_a_hostile_prefill_peer_and_keeps_serving():
    from bus.endpoint import Endpoint
    from harness.cluster_procs import ClusterProcs
    from nodes.engines.base import SamplingParams
    from nodes.loop_thread import LoopThread
    from tests.integration.cluster_helpers import client_for, greedy, load, reference
    from tests.nodes.cluster_fakes import tiny_engine

    tiny = load("tiny")
    sampling = wire.to_wire(SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    kv_thread = LoopThread("kv-rogue")
    with ClusterProcs(num_prefill=1, num_decode=1) as cluster:
        with Endpoint(cluster.broker_endpoint, "prefill", "rogue-prefill") as rogue:
            assert rogue.wait_registered(10)
            codes = [_refused_code(rogue, body) for body in MALFORMED_DECODE_BODIES]
            assert set(codes) <= {"bad_request", "rejected"}, codes
            # A request of its own, planned remote: its KV, then hostile kv_readys, then the real one.
            stream = rogue.request(wire.DECODE, {"prompt_token_ids": PROMPT, "sampling": sampling,
                                                 "session_id": None, "prefill": "auto"}, key="rogue", timeout=30)
            plan = next(stream).body
            assert plan["plan"] == "remote"
            kv = torch.nn.init.normal_(tiny_engine().runner.new_kv(len(PROMPT)))
            assert _send(kv_thread, None, plan["data_endpoint"], plan["transfer_id"], stream.request_id, kv).ok
            for change in HOSTILE_KV_READY_FIELDS:
                body = wire.to_wire(wire.KvReadyBody(stream.request_id, plan["transfer_id"], 7)) | change
                rogue.send_direct("decode-0", body)
            rogue.send_direct("decode-0", wire.to_wire(wire.KvReadyBody(stream.request_id, plan["transfer_id"], 7)))
            replies = list(stream)
            assert replies[-1].body["type"] == "done" and len(replies[-1].body["tokens"]) == 3
        decode = cluster.nodes["decode-0"]
        assert len(decode.find("kv_ready_dropped", reason="malformed")) == len(HOSTILE_KV_READY_FIELDS)
        prompt = tuple(tiny.tokenizer.encode("Hello world! How are you today?"))
        with client_for(cluster) as client:   # a normal request through the cluster still streams
            assert client.generate_blocking(prompt, greedy(6)).token_ids == reference(tiny, prompt, greedy(6))
        assert decode.alive
    kv_thread.stop()
