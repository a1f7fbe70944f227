"""A send that waits for its prefill pass (nodes/engines/kv_export.py's DeviceExport, on the CPU) over
real sockets: it never blocks the sender's loop, so another transfer on the same sender completes
meanwhile; it delivers the reference's bytes once the layers are told done; ready/when_ready say
what they should, and a cancel wakes a waiting send into a clear failure."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from bus.kv import KVReceiver, KVSender, KVTransferFailed, KVValueError, ReceiveConfig, SendConfig
from bus.kv.layout import plan_chunks
from nodes.engines.kv_export import DeviceExport
from nodes.engines.kv_quant import TorchQuantizer

pytestmark = pytest.mark.integration

LAYER_S = 0.3   # the "pass" computes one layer in this long


@pytest.fixture
async def pair():
    receiver = KVReceiver(config=ReceiveConfig(transfer_timeout=10.0))
    endpoint = await receiver.start()
    sender = KVSender(quantizer=TorchQuantizer(), chunk_bytes=4096,
                      config=SendConfig(ack_timeout=0.3, transfer_timeout=10.0))
    yield sender, receiver, endpoint
    await sender.close()
    await receiver.close()


def compute_later(export: DeviceExport, told: list[float]) -> threading.Thread:
    """The engine's thread: tells each layer done LAYER_S apart, noting when."""
    def run() -> None:
        for layer in range(export.shape[0]):
            time.sleep(LAYER_S)
            export.layer_done(layer, 0, export.shape[3])
            told.append(time.perf_counter())
    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_a_send_waiting_for_its_pass_lets_the_others_through(pair):
    sender, receiver, endpoint = pair
    kv = torch.randn(3, 2, 2, 64, 16)
    export, told = DeviceExport(kv, "int8"), []
    waiting = asyncio.ensure_future(sender.send(endpoint, "slow", "r1", export, mode="int8", compression="none"))
    await asyncio.sleep(0.05)   # the slow send is now waiting for layer 0
    thread = compute_later(export, told)
    other = torch.randn(3, 2, 2, 64, 16)
    started = time.perf_counter()
    report = await sender.send(endpoint, "quick", "r2", other, mode="raw", compression="none")
    finished = time.perf_counter()
    assert report.ok and not told and finished - started < LAYER_S   # done before the pass's first layer
    assert (await receiver.result("quick", timeout=5)).kv.tobytes() == other.numpy().tobytes()
    slow = await waiting
    thread.join()
    result = await receiver.result("slow", timeout=5)
    assert slow.ok and result.ok and np.abs(result.kv - kv.numpy()).max() < 0.1


async def test_a_cancelled_pass_fails_the_waiting_send_at_once(pair):
    sender, _, endpoint = pair
    export = DeviceExport(torch.randn(2, 2, 2, 64, 16), "int8")
    waiting = asyncio.ensure_future(sender.send(endpoint, "t", "r", export, mode="int8", compression="none"))
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    threading.Thread(target=export.cancel, args=("the request was cancelled",)).start()
    with pytest.raises((KVTransferFailed, KVValueError), match="cancelled"):
        await waiting
    assert time.perf_counter() - started < 1.0


def test_ready_and_when_ready_follow_the_layers():
    kv = torch.randn(2, 2, 2, 64, 16)
    export = DeviceExport(kv, "int8")
    specs = plan_chunks(export.info, 4096)
    last_of_layer0 = max(i for i, spec in enumerate(specs) if spec.plane_stop <= 4)
    told: list[int] = []
    export.when_ready(specs[0], lambda: told.append(0))
    export.when_ready(specs[-1], lambda: told.append(-1))
    assert not export.ready(specs[0]) and told == []
    export.layer_done(0, 0, 32)   # half the tokens: not final yet
    assert told == []
    export.layer_done(0, 32, 64)
    assert export.ready(specs[last_of_layer0]) and not export.ready(specs[-1]) and told == [0]
    export.when_ready(specs[0], lambda: told.append(1))   # ready already: at once
    assert told == [0, 1]
    export.cancel("gone")
    assert export.ready(specs[-1]) and told == [0, 1, -1]
