"""Who may say `kv_ready` to a decode node (issue #39, 4b): only for a request it admitted with a
remote plan and still waits for, naming a transfer it planned or received for that request, and
once one sender's kv_ready is accepted the request is bound to that node id (DIRECT `peer`, stamped
by the broker). A prefill retried on another node with a new transfer id after the first one's
transfer failed (docs/CLUSTER.md, failure handling) still starts decoding."""

from __future__ import annotations

import pytest

from bus.kv import TransferResult
from bus.kv.layout import KVInfo
from bus.kv.stats import TransferStats
from bus.messages import Direct
from nodes import wire
from nodes.decode_node import KvArrived
from tests.nodes.test_decode_node import PROMPT, make_work, prefilled, request


@pytest.fixture
def waiting(kv_thread):
    """A decode node holding r1 with a remote plan; its planned transfer id."""
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r1"))
    return work, endpoint, endpoint.of("partial", "r1")[0]["transfer_id"]


def receive(work, transfer_id, request_id="r1", ok=True):
    """A transfer the KV thread took for `request_id` (allocated, then verified or failed)."""
    kv, _ = prefilled(PROMPT)
    dst = work.kv.allocate(transfer_id, request_id, KVInfo(tuple(kv.shape), "float32"), "int8")
    assert dst is not None
    dst.copy_(kv)
    stats = TransferStats(transfer_id, request_id, raw_bytes=kv.nbytes)
    work.on_message(KvArrived(TransferResult(transfer_id, request_id, ok, dst if ok else None, 0,
                                             "" if ok else "checksum", stats)))
    if not ok:
        work.kv.give_back(dst)


def ready(work, peer, transfer_id, first_token_id=7, request_id="r1"):
    assert work.on_message(Direct(peer, wire.to_wire(wire.KvReadyBody(request_id, transfer_id, first_token_id))))


def test_a_kv_ready_naming_a_transfer_this_node_never_planned_is_dropped_and_counted(waiting):
    work, _, _ = waiting
    ready(work, "prefill-0", "made-up")
    assert work.jobs["r1"].kv_ready == {} and work.counters["kv_ready.unknown_transfer"] == 1


def test_a_kv_ready_for_a_request_not_waiting_for_remote_kv_is_dropped_and_counted(waiting):
    work, endpoint, transfer_id = waiting
    ready(work, "prefill-0", transfer_id, request_id="nobody")
    work.on_message(request("local", prefill="local"))   # running at once: it waits for no KV
    ready(work, "prefill-0", transfer_id, request_id="local")
    assert work.jobs["r1"].kv_ready == {} and work.jobs["local"].kv_ready == {}
    assert work.counters["kv_ready.unknown_request"] == 2


def test_the_first_accepted_kv_ready_binds_the_request_to_its_sender(waiting):
    work, endpoint, transfer_id = waiting
    kv, first_token_id = prefilled(PROMPT)
    ready(work, "prefill-0", transfer_id, first_token_id)
    ready(work, "prefill-9", transfer_id, 11)              # another node, same transfer: refused
    receive(work, "t-other")                               # a transfer of its own does not help it
    ready(work, "prefill-9", "t-other", 11)
    assert work.jobs["r1"].kv_ready == {transfer_id: first_token_id}
    assert work.counters["kv_ready.wrong_peer"] == 2
    receive(work, transfer_id)                             # prefill-0's KV: decoding starts from its token
    assert work.jobs["r1"].running
    (seq,) = work.engine.running
    assert seq.token_ids[len(PROMPT)] == first_token_id


def test_the_bound_sender_may_name_a_new_transfer_of_its_own(waiting):
    work, endpoint, transfer_id = waiting
    ready(work, "prefill-0", transfer_id)
    receive(work, transfer_id, ok=False)                   # its first transfer failed its checksums
    receive(work, "t-resent")                              # the client re-sent the prefill to it
    ready(work, "prefill-0", "t-resent")
    assert work.jobs["r1"].running


def test_a_prefill_retried_on_another_node_with_a_new_transfer_id_starts_decoding(waiting):
    work, endpoint, transfer_id = waiting
    receive(work, transfer_id, ok=False)                   # prefill-0 died mid-transfer: no kv_ready from it
    receive(work, "t-retry")                               # the client's retry on prefill-1
    ready(work, "prefill-1", "t-retry")
    assert work.jobs["r1"].running and not work.counters["kv_ready.wrong_peer"]


def test_a_sender_whose_transfer_failed_no_longer_holds_the_request(waiting):
    work, endpoint, transfer_id = waiting
    ready(work, "prefill-0", transfer_id)                  # accepted, but its KV then fails
    receive(work, transfer_id, ok=False)
    receive(work, "t-retry")
    ready(work, "prefill-1", "t-retry")
    assert work.jobs["r1"].running and not work.counters["kv_ready.wrong_peer"]
