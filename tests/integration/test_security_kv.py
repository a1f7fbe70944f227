"""CurveZMQ on the KV data plane over real sockets: only admitted prefill keys may send, KV goes
only to a receiver whose key is admitted as decode, and a forged transfer for a request nobody
planned is refused and counted."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv import KVReceiver, KVSender, KVTransferFailed, KVTransferTimeout, ReceiveConfig, SendConfig
from bus.kv.layout import DTYPES
from bus.security import split_server_key
from tests.bus.kv.conftest import synthetic_kv
from tests.bus.security_helpers import config_for, make_keys

pytestmark = pytest.mark.integration
FAST = SendConfig(ack_timeout=0.2, transfer_timeout=1.5)


@pytest.fixture
def keys(tmp_path):
    return make_keys(tmp_path), tmp_path


@pytest.fixture
async def receiver(keys):
    key_pairs, key_dir = keys
    planned = {"planned-transfer": "r1"}   # what the decode node planned: transfer id -> request id

    def allocate(transfer_id, request_id, info, mode):
        if planned.get(transfer_id) != request_id:
            return None
        return np.empty(info.shape, DTYPES[info.dtype])

    receiver = KVReceiver(allocate, config=ReceiveConfig(transfer_timeout=5.0),
                          security=config_for(key_pairs, key_dir, "decode"))
    await receiver.start()
    yield receiver
    await receiver.close()


async def _send(keys, name, endpoint, transfer_id, request_id):
    key_pairs, key_dir = keys
    sender = KVSender(chunk_bytes=4096, config=FAST, security=config_for(key_pairs, key_dir, name))
    try:
        return await sender.send(endpoint, transfer_id, request_id, synthetic_kv(), mode="raw")
    finally:
        await sender.close()


async def test_an_admitted_prefill_node_sends_planned_kv(keys, receiver):
    assert ";curve=" in receiver.endpoint
    report = await _send(keys, "prefill", receiver.endpoint, "planned-transfer", "r1")
    assert report.ok
    result = await receiver.result("planned-transfer", timeout=5)
    assert result.ok and np.array_equal(result.kv, synthetic_kv())


async def test_a_forged_transfer_for_an_unassigned_request_is_refused_and_counted(keys, receiver):
    with pytest.raises(KVTransferFailed, match="no destination"):
        await _send(keys, "prefill", receiver.endpoint, "forged-transfer", "someone-elses-request")
    # A real transfer id replayed for another request is just as unplanned.
    with pytest.raises(KVTransferFailed, match="no destination"):
        await _send(keys, "prefill", receiver.endpoint, "planned-transfer", "r2")
    assert receiver.metrics["refused.no_destination"] == 2


@pytest.mark.parametrize("name", ["intruder", "gateway", "decode"])
async def test_a_key_not_admitted_as_a_kv_sender_gets_nothing_through(keys, receiver, name):
    with pytest.raises(KVTransferTimeout):
        await _send(keys, name, receiver.endpoint, "planned-transfer", "r1")
    assert receiver.metrics["zap.denied"] >= 1 and receiver.metrics["refused.no_destination"] == 0
    assert not receiver._unclaimed and receiver.core.num_active == 0


async def test_a_plain_sender_cannot_reach_a_curve_receiver(receiver):
    sender = KVSender(config=FAST)
    try:
        with pytest.raises(KVTransferTimeout):
            await sender.send(receiver.endpoint, "planned-transfer", "r1", synthetic_kv(), mode="raw")
    finally:
        await sender.close()


async def test_kv_is_never_sent_to_an_unauthenticated_receiver(keys):
    plain = KVReceiver()
    endpoint = await plain.start()
    try:
        with pytest.raises(KVTransferFailed, match="no CURVE key"):
            await _send(keys, "prefill", endpoint, "t1", "r1")
        key_pairs, key_dir = keys
        rogue = KVReceiver(security=config_for(key_pairs, key_dir, "intruder"))
        rogue_endpoint = await rogue.start()
        with pytest.raises(KVTransferFailed, match="not admitted as a decode node"):
            await _send(keys, "prefill", rogue_endpoint, "t1", "r1")
        await rogue.close()
    finally:
        await plain.close()
    assert split_server_key(rogue_endpoint)[1] == key_pairs["intruder"][0]
