"""Plain-pyzmq baselines for `make bench-kv`: what moving the KV's bytes costs with no pdbus code.

Contract:
- `bare_send_seconds(socket, frames)`: one zero-copy multipart message of all the bytes and the
  peer's one-frame answer (`serve_bare`). The fastest this machine moves them over loopback TCP.
- `chunked_send_seconds(socket, chunks, window)`: the same bytes as the messages a `raw` transfer
  sends (one per chunk), each with its xxh3_64 computed by the sender, at most `window`
  unanswered, each verified by the peer before it answers (`serve_checked`). Raises
  `ChecksumMismatch` if the peer found a chunk that does not match its checksum.
`raw_chunks(source, chunk_bytes)` splits a KV tensor's bytes as a `raw` transfer's chunk plan does.

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

from bus.kv.layout import KVInfo, chunk_bytes_for, plan_chunks

if TYPE_CHECKING:   # torch only where a sender splits a tensor: the peer process does without it
    import torch


class ChecksumMismatch(RuntimeError):
    """The peer of the chunked baseline found a chunk that does not match its checksum."""


def raw_chunks(source: torch.Tensor, chunk_bytes: int) -> list[np.ndarray]:
    """Views of the source's bytes, one per chunk of a `raw` transfer of it (whole planes)."""
    import torch
    info = KVInfo(tuple(source.shape), str(source.dtype).removeprefix("torch."))
    flat = source.contiguous().view(torch.uint8).numpy().reshape(-1)
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
