"""The KV data plane over real sockets: in one process, and to a receiver in another process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from bus.kv import (
    FaultInjector,
    KVReceiver,
    KVSender,
    KVTransferFailed,
    KVTransferTimeout,
    KVValueError,
    ReceiveConfig,
    SendConfig,
)
from bus.kv.link import LinkShaper
from tests.bus.kv.conftest import synthetic_kv

pytestmark = pytest.mark.integration


@pytest.fixture
async def pair():
    receiver = KVReceiver(config=ReceiveConfig(transfer_timeout=5.0))
    endpoint = await receiver.start()
    sender = KVSender(chunk_bytes=4096, config=SendConfig(ack_timeout=0.3, transfer_timeout=5.0))
    yield sender, receiver, endpoint
    await sender.close()
    await receiver.close()


@pytest.mark.parametrize(("mode", "compression"), [("raw", "none"), ("raw", "lz4"), ("int8", "auto"),
                                                   ("bf16", "zstd"), ("int8_sym", "none")])
async def test_round_trip_over_tcp(pair, mode, compression):
    sender, receiver, endpoint = pair
    kv = synthetic_kv(tokens=64)
    report = await sender.send(endpoint, "t1", "r1", kv, mode=mode, compression=compression, token_offset=5)
    result = await receiver.result("t1", timeout=5)
    assert result.ok and report.ok and result.token_offset == 5
    assert report.stats.raw_bytes == kv.nbytes and report.stats.wire_bytes > 0
    if mode == "raw":
        assert result.kv.tobytes() == kv.tobytes()
    else:
        assert np.abs(result.kv - kv).max() < 0.1


async def test_concurrent_transfers_share_one_connection(pair):
    sender, receiver, endpoint = pair
    kvs = [synthetic_kv(seed=i) for i in range(4)]
    reports = await asyncio.gather(*(sender.send(endpoint, f"t{i}", f"r{i}", kv, mode="raw")
                                     for i, kv in enumerate(kvs)))
    assert all(r.ok for r in reports)
    for i, kv in enumerate(kvs):
        assert (await receiver.result(f"t{i}", timeout=5)).kv.tobytes() == kv.tobytes()


async def test_flipped_bytes_are_caught_and_resent(pair):
    sender, receiver, endpoint = pair
    sender.faults = FaultInjector(flip_probability=0.3, seed=11)
    kv = synthetic_kv(tokens=64)
    report = await sender.send(endpoint, "t1", "r1", kv, mode="raw", compression="none")
    result = await receiver.result("t1", timeout=5)
    assert result.ok and result.kv.tobytes() == kv.tobytes()
    assert sender.faults.flips > 0 and report.stats.resends >= 1
    assert report.stats.checksum_failures + report.stats.rejected + receiver.core.undecodable >= 1


async def test_dropped_messages_are_recovered(pair):
    sender, receiver, endpoint = pair
    sender.faults = FaultInjector(drop_probability=0.2, seed=5)
    kv = synthetic_kv(tokens=64)
    await sender.send(endpoint, "t1", "r1", kv, mode="raw")
    assert (await receiver.result("t1", timeout=5)).kv.tobytes() == kv.tobytes()
    assert sender.faults.drops > 0


async def test_persistent_corruption_fails_closed_on_both_sides(pair):
    sender, receiver, endpoint = pair
    sender.faults = FaultInjector(flip_probability=1.0, seed=1, only_kinds=(1,))
    with pytest.raises(KVTransferFailed):
        await sender.send(endpoint, "t1", "r1", synthetic_kv(), mode="int8")
    result = await receiver.result("t1", timeout=5)
    assert not result.ok and result.kv is None


async def test_a_missing_receiver_times_out():
    sender = KVSender(config=SendConfig(ack_timeout=0.1, transfer_timeout=0.5))
    with pytest.raises(KVTransferTimeout):
        await sender.send("tcp://127.0.0.1:1", "t1", "r1", synthetic_kv(), mode="raw")
    await sender.close()


async def test_waiting_for_a_transfer_that_never_comes_times_out(pair):
    _, receiver, _ = pair
    with pytest.raises(KVTransferTimeout):
        await receiver.result("never", timeout=0.2)


async def test_a_shaped_link_delivers_everything_in_order_and_never_faster_than_its_rate(pair):
    sender, receiver, endpoint = pair
    kv = synthetic_kv(tokens=64)
    sender.shaper = LinkShaper(4e6)   # 4 MB/s: the chunks queue on the "wire" while encoding goes on
    started = asyncio.get_running_loop().time()
    report = await sender.send(endpoint, "t1", "r1", kv, mode="raw")
    elapsed = asyncio.get_running_loop().time() - started
    result = await receiver.result("t1", timeout=5)
    assert report.ok and result.ok and result.kv.tobytes() == kv.tobytes()
    assert report.stats.resends == 0 and report.stats.num_chunks > 5
    assert elapsed >= report.stats.wire_bytes / 4e6   # the last byte left when the link allowed


async def test_an_abort_mid_flight_frees_the_receiver(pair):
    sender, receiver, endpoint = pair
    sender.shaper = LinkShaper(2e5)   # slow: ~0.25 s
    task = asyncio.ensure_future(sender.send(endpoint, "t1", "r1", synthetic_kv(tokens=64), mode="raw"))
    await asyncio.sleep(0.03)
    assert await sender.abort("t1", "client went away")
    with pytest.raises(KVTransferFailed, match="aborted"):
        await task
    result = await receiver.result("t1", timeout=5)
    assert not result.ok and "client went away" in result.reason
    assert not await sender.abort("t1")


async def test_a_receiver_cancel_fails_the_sender(pair):
    sender, receiver, endpoint = pair
    sender.shaper = LinkShaper(2e5)
    task = asyncio.ensure_future(sender.send(endpoint, "t1", "r1", synthetic_kv(tokens=64), mode="raw"))
    await asyncio.sleep(0.03)
    receiver.cancel("t1", "request aborted")
    with pytest.raises(KVTransferFailed, match="request aborted"):
        await task


async def test_bad_kv_is_refused_before_any_io(pair):
    sender, _, endpoint = pair
    with pytest.raises(KVValueError):
        await sender.send(endpoint, "t1", "r1", np.zeros((2, 2, 2), np.float32))


async def test_a_receiver_in_another_process(tmp_path):
    peer = subprocess.Popen([sys.executable, "-m", "harness.bench.kv_decode_side", "--digests", "--faults", "3"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        endpoints = json.loads(peer.stdout.readline())
        sender = KVSender(chunk_bytes=8192, config=SendConfig(ack_timeout=0.3, transfer_timeout=10))
        kv = synthetic_kv(layers=4, tokens=200)
        report = await sender.send(endpoints["kv"], "t1", "r1", kv, mode="raw")
        line = json.loads(peer.stdout.readline())
        assert report.ok and line["ok"] and line["digest"] == xxhash.xxh3_64_intdigest(kv.view(np.uint8))
        await sender.send(endpoints["kv"], "t2", "r2", kv, mode="int8", compression="lz4")
        assert json.loads(peer.stdout.readline())["ok"]
        await sender.close()
    finally:
        peer.stdin.close()
        peer.wait(timeout=10)


async def test_results_stream_yields_successes_and_failures_in_order(pair):
    sender, receiver, endpoint = pair
    stream = receiver.results()
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    await sender.send(endpoint, "ok-1", "r1", synthetic_kv(), mode="raw")
    assert (await first).transfer_id == "ok-1"
    sender.faults = FaultInjector(flip_probability=1.0, seed=1, only_kinds=(1,))
    with pytest.raises(KVTransferFailed):
        await sender.send(endpoint, "bad-1", "r2", synthetic_kv(), mode="int8")
    failed = await stream.__anext__()
    assert failed.transfer_id == "bad-1" and not failed.ok


async def test_senders_dial_the_advertised_endpoint_not_the_bound_one():
    from harness.chaos.proxy import PartitionProxy
    from harness.cluster_procs import free_port

    port = free_port()
    proxy = PartitionProxy(port).start()
    receiver = KVReceiver(bind=f"tcp://127.0.0.1:{port}", advertise=f"tcp://127.0.0.1:{proxy.port}")
    sender = KVSender(chunk_bytes=4096)
    try:
        endpoint = await receiver.start()
        assert endpoint == f"tcp://127.0.0.1:{proxy.port}"
        kv = synthetic_kv(tokens=16)
        report = await sender.send(endpoint, "t1", "r1", kv, mode="raw")
        result = await receiver.result("t1", timeout=5)
        assert report.ok and result.kv.tobytes() == kv.tobytes()
        assert proxy.num_connections == 1   # the bytes went through the advertised address
    finally:
        await sender.close()
        await receiver.close()
        proxy.stop()


async def test_the_receiver_logs_every_finished_transfer_and_every_undecodable_message(pair):
    import zmq
    import zmq.asyncio
    from structlog.testing import capture_logs

    sender, receiver, endpoint = pair
    garbage = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    garbage.connect(endpoint)
    with capture_logs() as logs:
        await garbage.send_multipart([b"\x00not a kv header", b"payload"])
        kv = synthetic_kv(tokens=8)
        await sender.send(endpoint, "t1", "r1", kv, mode="raw")
        await receiver.result("t1", timeout=5)
    garbage.close(linger=0)
    events = {e["event"]: e for e in logs}
    assert events["kv_undecodable"]["count"] >= 1
    done = events["kv_received"]
    assert (done["transfer_id"], done["ok"], done["rejected"], done["checksum_failures"]) == ("t1", True, 0, 0)


async def test_a_raw_transfer_kept_as_pieces_arrives_bit_exact_and_a_callback_owns_its_results():
    """The decode node's setup: raw KV kept as its verified frames, results taken by on_result.
    The receiver keeps no reference to a result the callback took (it would hold the KV frames)."""
    import gc
    import weakref

    from bus.kv import RawPieces
    results, refs = [], []

    def allocate(transfer_id, request_id, info, mode):
        pieces = RawPieces(info)
        refs.append(weakref.ref(pieces))
        return pieces

    receiver = KVReceiver(allocate, config=ReceiveConfig(transfer_timeout=5.0), on_result=results.append)
    endpoint = await receiver.start()
    sender = KVSender(chunk_bytes=4096, config=SendConfig(ack_timeout=0.3, transfer_timeout=5.0))
    try:
        kv = synthetic_kv(tokens=64)
        assert (await sender.send(endpoint, "t1", "r1", kv, mode="raw", compression="none")).ok
        for _ in range(50):
            if results:
                break
            await asyncio.sleep(0.01)
        [result] = results
        assert result.ok and isinstance(result.kv, RawPieces) and result.kv.num_pieces > 1
        assert result.kv.to_numpy().tobytes() == kv.tobytes()
        results.clear()
        del result
        gc.collect()
        assert refs[0]() is None
    finally:
        await sender.close()
        await receiver.close()


async def test_a_queued_flood_is_read_in_bounded_batches_and_other_tasks_still_run(pair, monkeypatch):
    """The read loop takes what is already queued without a future per message, at most MAX_DRAIN at a
    time: every message is still handled, and the loop's other tasks run between two batches."""
    import zmq
    import zmq.asyncio

    import bus.kv.receiver as receiver_module

    monkeypatch.setattr(receiver_module, "MAX_DRAIN", 4)
    sender, receiver, endpoint = pair
    flood = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    flood.connect(endpoint)
    ticks = []

    async def ticker():
        while True:
            ticks.append(receiver.core.undecodable)
            await asyncio.sleep(0)

    for _ in range(200):   # queued before the receiver reads any: one send, many messages waiting
        await flood.send_multipart([b"\x00not a kv header", b"payload"])
    task = asyncio.get_running_loop().create_task(ticker())
    for _ in range(500):
        if receiver.core.undecodable >= 200:
            break
        await asyncio.sleep(0.005)
    task.cancel()
    flood.close(linger=0)
    assert receiver.core.undecodable == 200
    interleaved = sorted({count for count in ticks if 0 < count < 200})
    assert len(interleaved) >= 5   # the ticker ran while the flood was being read, not only after it
    kv = synthetic_kv(tokens=8)   # and the receiver still serves a transfer
    assert (await sender.send(endpoint, "t1", "r1", kv, mode="raw")).ok


# ---- a hostile or buggy peer never takes the receiver or the sender down (issue #39) ----

async def dealer_to(endpoint: str):
    import zmq
    import zmq.asyncio
    socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    return socket


async def test_a_malformed_chunk_does_not_stop_the_receiver(pair):
    """A CHUNK whose dtype is a list (valid trailer) raised TypeError out of the read task: no
    transfer to the node completed again."""
    from bus.kv.frames import CHUNK
    from tests.bus.kv.conftest import seal
    from tests.bus.kv.test_hostile_headers import FIELD, valid_chunk

    sender, receiver, endpoint = pair
    hostile = await dealer_to(endpoint)
    fields, payload = valid_chunk()
    fields[FIELD["dtype"]] = ["float32"]
    await hostile.send_multipart([seal(CHUNK, fields), *payload])
    fields[FIELD["frames"]] = {"not": "a list"}
    await hostile.send_multipart([seal(CHUNK, fields), *payload])
    kv = synthetic_kv(tokens=16)
    report = await sender.send(endpoint, "t1", "r1", kv, mode="raw")
    result = await receiver.result("t1", timeout=5)
    hostile.close(linger=0)
    assert report.ok and result.kv.tobytes() == kv.tobytes() and receiver.core.undecodable == 2


async def test_an_unexpected_error_in_one_message_is_logged_counted_and_the_loop_goes_on(pair, monkeypatch):
    from structlog.testing import capture_logs

    sender, receiver, endpoint = pair
    on_frames = receiver.core.on_frames
    calls = {"n": 0}

    def breaks_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a bug in one message's handling")
        return on_frames(*args, **kwargs)

    monkeypatch.setattr(receiver.core, "on_frames", breaks_once)
    with capture_logs() as logs:
        report = await sender.send(endpoint, "t1", "r1", synthetic_kv(tokens=16), mode="raw")
    assert report.ok and report.stats.resends >= 1 and receiver.metrics["errors.message"] == 1
    [event] = [e for e in logs if e["event"] == "kv_message_failed"]
    assert event["transfer_id"] == "t1" and "RuntimeError" in event["error"]


async def test_the_data_sockets_bound_what_a_peer_may_send():
    import zmq

    from bus.kv.header_checks import MAX_HEADER_BYTES

    receiver = KVReceiver(config=ReceiveConfig(max_chunk_bytes=64 * 1024))
    endpoint = await receiver.start()
    sender = KVSender(chunk_bytes=4096)
    try:
        assert 64 * 1024 < receiver._socket.getsockopt(zmq.MAXMSGSIZE) < 64 * 1024 + 2 * MAX_HEADER_BYTES
        hostile = await dealer_to(endpoint)
        await hostile.send_multipart([b"\x00" * (1 << 20)])     # over the bound: the peer is cut off
        kv = synthetic_kv(tokens=16)
        assert (await sender.send(endpoint, "t1", "r1", kv, mode="raw")).ok
        assert (await receiver.result("t1", timeout=5)).kv.tobytes() == kv.tobytes()
        assert receiver.core.undecodable == 0    # the oversized message never reached the receiver
        assert sender.peers.get(endpoint).socket.getsockopt(zmq.MAXMSGSIZE) == MAX_HEADER_BYTES
        hostile.close(linger=0)
    finally:
        await sender.close()
        await receiver.close()


async def test_an_idle_peer_is_closed_and_forgotten():
    """A decode node that restarted on a new port left a DEALER reconnecting to the old one for ever."""
    receiver = KVReceiver()
    endpoint = await receiver.start()
    sender = KVSender(chunk_bytes=4096, peer_idle_s=0.2)
    try:
        assert (await sender.send(endpoint, "t1", "r1", synthetic_kv(tokens=16), mode="raw")).ok
        connection = sender.peers.get(endpoint)
        await receiver.close()                   # the node goes away
        for _ in range(100):
            if not sender.peers.endpoints():
                break
            await asyncio.sleep(0.02)
        assert not sender.peers.endpoints() and connection.socket.closed and connection.reader.done()
    finally:
        await sender.close()


async def test_a_transfer_in_flight_is_never_cut_by_the_idle_timer(pair):
    _, receiver, endpoint = pair
    sender = KVSender(chunk_bytes=4096, peer_idle_s=0.05, config=SendConfig(ack_timeout=0.3, transfer_timeout=5.0))
    sender.shaper = LinkShaper(2e5)              # ~0.25 s: five idle periods long
    try:
        kv = synthetic_kv(tokens=64)
        assert (await sender.send(endpoint, "t1", "r1", kv, mode="raw")).ok
        assert (await sender.send(endpoint, "t2", "r2", kv, mode="raw")).ok
        assert (await receiver.result("t2", timeout=5)).kv.tobytes() == kv.tobytes()
    finally:
        await sender.close()


async def test_a_sender_holds_at_most_max_peers_endpoints():
    receivers = [KVReceiver() for _ in range(3)]
    endpoints = [await r.start() for r in receivers]
    sender = KVSender(chunk_bytes=4096, max_peers=2, config=SendConfig(ack_timeout=0.3, transfer_timeout=5.0))
    try:
        kv = synthetic_kv(tokens=16)
        for i, endpoint in enumerate(endpoints):   # the least recently used idle peer makes room
            assert (await sender.send(endpoint, f"t{i}", "r", kv, mode="raw")).ok
            assert len(sender.peers.endpoints()) <= 2
        assert sender.peers.endpoints() == endpoints[1:]
        sender.shaper = LinkShaper(1e5)            # two peers busy: a third endpoint is refused, not queued
        busy = [asyncio.ensure_future(sender.send(e, f"b{i}", "r", synthetic_kv(tokens=64), mode="raw"))
                for i, e in enumerate(endpoints[1:])]
        await asyncio.sleep(0.02)
        with pytest.raises(KVTransferFailed, match="peers"):
            await sender.send(endpoints[0], "t9", "r", kv, mode="raw")
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)
    finally:
        await sender.close()
        for receiver in receivers:
            await receiver.close()
