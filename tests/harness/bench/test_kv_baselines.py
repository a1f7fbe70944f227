"""bench-kv's plain-pyzmq baselines: the chunks a raw transfer would send, and a peer that checks them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
import xxhash
import zmq
import zmq.asyncio

from bus.kv import KVReceiver, KVSender, RawPieces, ReceiveConfig
from bus.kv.layout import KVInfo, chunk_bytes_for, plan_chunks
from bus.kv.link import LinkShaper
from harness.bench.kv_baselines import (
    FLOOR_CASES,
    FLOOR_LABELS,
    ChecksumMismatch,
    bare_send_seconds,
    chunked_send_seconds,
    int8_wire_chunks,
    print_chunking_floor,
    print_link_floor,
    raw_chunk_frames,
    raw_chunks,
    run_chunking_floor,
    run_link_floor,
)
from nodes.engines.kv_quant import TorchQuantizer
from tests.harness.bench.kv_servers import start_baseline_servers, stop_servers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_chunks_are_the_raw_plans_chunks_and_cover_the_bytes_once(dtype):
    source = torch.randn(4, 2, 3, 64, 16).to(dtype)
    chunk_bytes = 3 * 64 * 16 * source.element_size()   # three planes a chunk
    chunks = raw_chunks(source, chunk_bytes)
    info = KVInfo(tuple(source.shape), str(dtype).removeprefix("torch."))
    plan = plan_chunks(info, chunk_bytes_for(info, "raw", chunk_bytes))
    assert len(chunks) == len(plan) == 8
    assert np.concatenate(chunks).tobytes() == source.view(torch.uint8).numpy().tobytes()


def test_raw_chunk_frames_are_the_frames_a_raw_transfer_sends():
    source = torch.randn(30, 2, 3, 1024, 64).to(torch.bfloat16)   # SmolLM2's 1024-token cache
    whole, cut = raw_chunks(source, 4 << 20), raw_chunk_frames(source, 4 << 20)
    receiver_view = [[frame.nbytes for frame in frames] for frames in cut]
    assert receiver_view == [[1 << 20] * 3 + [6 << 17]] * 6   # 8, 8, 8 and 6 planes of 128 KiB
    assert [np.concatenate(frames).tobytes() for frames in cut] == [chunk.tobytes() for chunk in whole]


async def test_the_checked_peer_verifies_a_chunk_sent_as_several_frames(peers):
    frames = [np.arange(4096, dtype=np.uint8), np.ones(100, np.uint8)]
    assert await chunked_send_seconds(peers["checked"], [frames], window=1) > 0


def test_raw_chunks_refuse_a_plan_that_splits_planes():
    source = torch.zeros(1, 2, 1, 64, 16)
    with pytest.raises(ValueError, match="whole planes"):
        raw_chunks(source, 256)


@pytest.fixture
async def peers():
    servers, endpoints, tasks = await start_baseline_servers()
    clients = {name: zmq.asyncio.Context.instance().socket(zmq.DEALER) for name in endpoints}
    for name, client in clients.items():
        client.connect(endpoints[name])
    yield clients
    await stop_servers(servers, tasks)
    for client in clients.values():
        client.close(linger=0)


async def test_both_baselines_move_the_bytes_over_tcp(peers):
    chunks = raw_chunks(torch.randn(4, 2, 3, 64, 16), 3 * 64 * 16 * 4)
    assert await bare_send_seconds(peers["bare"], chunks) > 0
    assert await chunked_send_seconds(peers["checked"], chunks, window=3) > 0
    assert await chunked_send_seconds(peers["bare"], chunks, window=3, checksum=False) > 0


async def test_an_unchecked_chunk_travels_alone_and_a_checking_peer_refuses_it(peers):
    """Without checksums a message is the chunk alone: the checking peer has nothing to verify and
    answers "bad", so the baseline cannot pass an unchecked send off as a checked one."""
    with pytest.raises(ChecksumMismatch):
        await chunked_send_seconds(peers["checked"], [np.ones(64, np.uint8)], window=1, checksum=False)


async def test_the_checked_peer_answers_bad_to_a_chunk_that_does_not_match(peers):
    socket = peers["checked"]
    payload = np.arange(4096, dtype=np.uint8)
    await socket.send_multipart([xxhash.xxh3_64_digest(payload[1:]), payload])
    assert (await socket.recv_multipart())[-1] == b"bad"
    await socket.send_multipart([b"only one frame"])
    assert (await socket.recv_multipart())[-1] == b"bad"


async def test_a_peer_that_found_a_mismatch_fails_the_chunked_baseline():
    context = zmq.asyncio.Context.instance()
    server, client = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    server.bind("tcp://127.0.0.1:0")
    client.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))

    async def answer_bad():
        frames = await server.recv_multipart()
        await server.send_multipart([frames[0], b"bad"])

    task = asyncio.get_running_loop().create_task(answer_bad())
    with pytest.raises(ChecksumMismatch):
        await chunked_send_seconds(client, [np.ones(64, np.uint8)], window=1)
    await task
    server.close(linger=0)
    client.close(linger=0)


async def test_the_floor_pass_times_every_case_and_pdbus_delivers_each_raw_transfer(capsys):
    received = []
    receiver = KVReceiver(lambda transfer_id, request_id, info, mode: RawPieces(info), quantizer=TorchQuantizer(),
                          on_result=received.append, config=ReceiveConfig(transfer_timeout=5.0))
    servers, endpoints, tasks = await start_baseline_servers()
    endpoints["kv"] = await receiver.start()
    sources = {"fp32": torch.randn(4, 2, 3, 64, 16), "bf16": torch.randn(4, 2, 3, 64, 16).to(torch.bfloat16)}
    floor = await run_chunking_floor(endpoints, sources, TorchQuantizer(), 3 * 64 * 16 * 4, repeats=2)
    await stop_servers(servers, tasks)
    await receiver.close()
    assert set(floor) == {(name, case) for name in sources for case in FLOOR_CASES}
    assert FLOOR_CASES == ["bare pyzmq", "bare, a frame a chunk", "bare, chunk frames", "chunked, no checksum",
                           "chunked pyzmq", "raw+none"]
    assert all(seconds > 0 for seconds in floor.values())
    assert len(received) == 2 * 3 and all(result.ok for result in received)   # warm-up round too
    print_chunking_floor(floor)
    table = capsys.readouterr().out
    assert "| fp32 |" in table and "| bf16 |" in table
    assert all(label in table for label in FLOOR_LABELS.values())


async def test_int8_sized_chunks_weigh_what_an_int8_transfer_puts_on_the_wire():
    source = torch.randn(4, 2, 3, 64, 16)
    chunk_bytes = 3 * 64 * 16 * 2
    sizes = [chunk.nbytes for chunk in int8_wire_chunks(source, chunk_bytes)]
    receiver = KVReceiver(quantizer=TorchQuantizer(), config=ReceiveConfig(transfer_timeout=5.0))
    endpoint = await receiver.start()
    sender = KVSender(quantizer=TorchQuantizer(), chunk_bytes=chunk_bytes)
    report = await sender.send(endpoint, "t", "r", source, mode="int8", compression="none")
    await sender.close()
    await receiver.close()
    assert len(sizes) == report.stats.num_chunks
    assert report.stats.wire_bytes == sum(sizes)   # payloads only, as both count them


async def test_a_shaped_chunked_send_is_never_faster_than_its_link(peers):
    chunks = [np.ones(50_000, np.uint8) for _ in range(6)]
    rate = 20e6   # 300 kB at 20 MB/s: 15 ms of wire
    seconds = await chunked_send_seconds(peers["checked"], chunks, window=2, shaper=LinkShaper(rate))
    assert seconds >= 6 * 50_000 / rate


async def test_the_link_floor_times_both_chunk_sizes_and_prints_beside_pdbus(capsys):
    servers, endpoints, tasks = await start_baseline_servers()
    # ~0.8 MB raw through a 20 MB/s link (~40 ms against int8's ~10): the gap dwarfs scheduling noise,
    # which at 49 KB through 200 MB/s once put raw below int8 in a clean-clone run.
    sources = {"fp32": torch.randn(2, 2, 3, 64, 256)}
    floor = await run_link_floor(endpoints, sources, 3 * 64 * 256 * 4, repeats=1, link=20e6)
    await stop_servers(servers, tasks)
    assert set(floor) == {("fp32", "raw-sized"), ("fp32", "int8-sized")}
    assert floor["fp32", "raw-sized"] > floor["fp32", "int8-sized"] > 0   # fewer bytes through the same link
    print_link_floor(floor, {"fp32 raw+none": (0.004,), "fp32 int8+auto": (0.002,)}, "test")
    assert "| fp32 |" in capsys.readouterr().out
