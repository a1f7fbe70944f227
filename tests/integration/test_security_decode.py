"""A real decode node's KV receiver with CURVE on (tiny engine, recording bus endpoint): KV is taken
only for a request this node planned as remote and is waiting for; forged transfers are refused
before a byte is written, counted, and never decoded from."""

from __future__ import annotations

import time

import pytest
import torch

from bus.kv import KVSender, KVTransferFailed, SendConfig
from bus.messages import Direct
from nodes import cluster_wire as wire
from nodes.engines.kv_quant import TorchQuantizer
from tests.bus.security_helpers import config_for, make_keys
from tests.nodes.test_decode_node import PROMPT, make_work, request

pytestmark = pytest.mark.integration


@pytest.fixture
def secured(tmp_path):
    from nodes.runtime import LoopThread

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
    assert work.receiver.metrics["refused.no_destination"] == 2
    _take_inbox(work, endpoint, until=0.3)
    assert work.jobs["r1"].arrived == {} and not work.jobs["r1"].running   # still waiting, untouched
    # The real transfer, then its kv_ready over the (authenticated) control plane: decoding starts.
    assert _send(kv_thread, prefill, plan["data_endpoint"], plan["transfer_id"], "r1", kv).ok
    work.on_message(Direct("prefill-1", wire.kv_ready_body("r1", plan["transfer_id"], 7)))
    _take_inbox(work, endpoint)
    assert "r1" not in work.jobs or work.jobs["r1"].running


def test_a_kv_ready_alone_never_starts_decoding(secured):
    work, endpoint, _, _ = secured
    assert work.on_message(request("r1"))
    (plan,) = endpoint.of("partial", "r1")
    work.on_message(Direct("someone", wire.kv_ready_body("r1", plan["transfer_id"], 7)))
    work.on_message(Direct("someone", wire.kv_ready_body("r1", "made-up", 7)))
    assert not work.jobs["r1"].running and not work.engine.has_unfinished()
