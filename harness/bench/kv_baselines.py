"""Plain-pyzmq baselines for `make bench-kv`: what moving the KV's bytes costs with no pdbus code.

Contract:
- `bare_send_seconds(socket, frames)`: one zero-copy multipart message of all the bytes and the
  peer's one-frame answer (`serve_bare`). The fastest this machine moves them over loopback TCP.
- `chunked_send_seconds(socket, chunks, window)`: the same bytes as the messages a `raw` transfer
  sends (one per chunk), each with its xxh3_64 computed by the sender, at most `window`
  unanswered, each verified by the peer before it answers (`serve_checked`). Raises
  `ChecksumMismatch` if the peer found a chunk that does not match its checksum.
`raw_chunks(source, chunk_bytes)` splits a KV tensor's bytes as a `raw` transfer's chunk plan does.
`run_chunking_floor(endpoints, sources, quantizer, chunk_bytes, repeats)` times bare, chunked and
pdbus's raw+none back to back in every round (its own pass: see its docstring), and
`print_chunking_floor` prints them as bench-kv's table.

Why the second one: the target "raw+none reaches 80 % of a bare send" compares a protocol that
chunks, acknowledges and checksums (the issue asks for all three) with one message. The chunked
baseline does exactly those three things and nothing else, so "raw+none / chunked" says how much of
the gap pdbus's own code adds, and "chunked / bare" how much the three cost by themselves on this
machine, where the two processes' main threads and their two I/O threads share two cores.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import xxhash
import zmq.asyncio

from bus.kv import KVSender, SendConfig
from bus.kv.layout import KVInfo, chunk_bytes_for, plan_chunks
from bus.kv.quant import Quantizer

if TYPE_CHECKING:   # torch only where a sender splits a tensor: the peer process does without it
    import torch


class ChecksumMismatch(RuntimeError):
    """The peer of the chunked baseline found a chunk that does not match its checksum."""


def flat_bytes(source: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as one uint8 numpy view (no copy of a contiguous tensor)."""
    import torch
    return source.contiguous().view(torch.uint8).numpy().reshape(-1)


def raw_chunks(source: torch.Tensor, chunk_bytes: int) -> list[np.ndarray]:
    """Views of the source's bytes, one per chunk of a `raw` transfer of it (whole planes)."""
    info = KVInfo(tuple(source.shape), str(source.dtype).removeprefix("torch."))
    flat = flat_bytes(source)
    plane_bytes = info.num_tokens * info.head_dim * info.itemsize
    specs = plan_chunks(info, chunk_bytes_for(info, "raw", chunk_bytes))
    if any(spec.tokens != slice(0, info.num_tokens) for spec in specs):
        raise ValueError("the baseline splits whole planes only (a plane is larger than a chunk)")
    return [flat[spec.planes.start * plane_bytes:spec.planes.stop * plane_bytes] for spec in specs]


async def bare_send_seconds(socket: zmq.asyncio.Socket, frames: list) -> float:
    """One zero-copy multipart send of the same bytes and the peer's one-frame answer."""
    started = time.perf_counter()
    await socket.send_multipart(frames, copy=False)
    await socket.recv_multipart()
    return time.perf_counter() - started


async def chunked_send_seconds(socket: zmq.asyncio.Socket, chunks: list[np.ndarray], window: int) -> float:
    started = time.perf_counter()
    num_sent = num_answered = 0
    while num_answered < len(chunks):
        while num_sent < len(chunks) and num_sent - num_answered < window:
            chunk = chunks[num_sent]
            await socket.send_multipart([xxhash.xxh3_64_digest(chunk), chunk], copy=False)
            num_sent += 1
        answer = await socket.recv_multipart()
        if answer[-1] != b"ok":
            raise ChecksumMismatch("the chunked baseline's peer found a chunk that does not match its checksum")
        num_answered += 1
    return time.perf_counter() - started


async def serve_bare(socket: zmq.asyncio.Socket) -> None:
    while True:
        frames = await socket.recv_multipart(copy=False)
        await socket.send_multipart([frames[0], b"ok"])


async def serve_checked(socket: zmq.asyncio.Socket) -> None:
    """Answer each [checksum, payload] message "ok" once its payload matches, else "bad"."""
    while True:
        frames = await socket.recv_multipart(copy=False)
        matches = len(frames) == 3 and xxhash.xxh3_64_digest(frames[2].buffer) == frames[1].bytes
        await socket.send_multipart([frames[0], b"ok" if matches else b"bad"])


FLOOR_CASES = ["bare pyzmq", "chunked pyzmq", "raw+none"]


async def run_chunking_floor(endpoints: dict, sources: dict, quantizer: Quantizer, chunk_bytes: int,
                             repeats: int) -> dict:
    """Best-of-N seconds of a bare send, the chunked plain-pyzmq baseline and raw+none, per source,
    the three back to back in every round (in turn first). A pass of its own, after the main ones:
    run inside their rounds, the baseline's checksum pass left the source in cache for whichever
    case came next, and moved raw+none and the auto / none pairs by more than the targets' margins."""
    sender = KVSender(quantizer=quantizer, chunk_bytes=chunk_bytes,
                      config=SendConfig(window=4, ack_timeout=5.0, transfer_timeout=60.0))
    context = zmq.asyncio.Context.instance()
    bare, checked = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    bare.connect(endpoints["bare"])
    checked.connect(endpoints["checked"])
    times: dict[tuple[str, str], list[float]] = {}
    for name, source in sources.items():
        frames = np.array_split(flat_bytes(source), 30)   # as bench-kv's bare send splits them
        chunks = raw_chunks(source, chunk_bytes)
        for round_ in range(repeats + 1):   # round 0 warms up
            for case in FLOOR_CASES[round_ % 3:] + FLOOR_CASES[:round_ % 3]:
                started = time.perf_counter()
                if case == "bare pyzmq":
                    await bare_send_seconds(bare, frames)
                elif case == "chunked pyzmq":
                    await chunked_send_seconds(checked, chunks, sender.config.window)
                else:
                    await sender.send(endpoints["kv"], f"floor-{name}-{round_}", "bench", source, mode="raw",
                                      compression="none")
                if round_:
                    times.setdefault((name, case), []).append(time.perf_counter() - started)
    await sender.close()
    bare.close(linger=0)
    checked.close(linger=0)
    return {key: min(values) for key, values in times.items()}


def print_chunking_floor(floor: dict) -> None:
    """Not a target: how much of the gap to a bare send chunking, answering and checksumming cost
    by themselves, and how much pdbus's own code adds to them."""
    print("\n### Chunked, acknowledged and checksummed, in plain pyzmq (loopback; not a target)\n\n"
          "Same chunks as `raw`, xxh3_64 on both sides, the same window, no pdbus code; a pass of its own, "
          "the three cases back to back in every round, best of N.\n\n"
          "| source | bare ms | chunked pyzmq ms | raw+none ms | chunked / bare throughput "
          "| raw+none / chunked throughput | raw+none / bare throughput |\n|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(name for name, _ in floor):
        bare, chunked, raw = (floor[name, case] for case in ("bare pyzmq", "chunked pyzmq", "raw+none"))
        print(f"| {name} | {bare * 1e3:.1f} | {chunked * 1e3:.1f} | {raw * 1e3:.1f} | {bare / chunked:.2f} "
              f"| {chunked / raw:.2f} | {bare / raw:.2f} |")
