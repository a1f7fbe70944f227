"""Plain-pyzmq baselines for `make bench-kv`: what moving the KV's bytes costs with no pdbus code.

Contract:
- `bare_send_seconds(socket, frames)`: one zero-copy multipart message of all the bytes and the
  peer's one-frame answer (`serve_bare`). The fastest this machine moves them over loopback TCP.
- `chunked_send_seconds(socket, chunks, window)`: the same bytes as the messages a `raw` transfer
  sends (one per chunk; a chunk is an array, or its frames), each with its xxh3_64 computed by the sender, at most `window`
  unanswered, each verified by the peer before it answers (`serve_checked`). Raises
  `ChecksumMismatch` if the peer found a chunk that does not match its checksum. With a
  `shaper` (bus.kv.link) each chunk waits for its place on the virtual wire, as KVSender's do.
  With `checksum=False` a message is the chunk alone, for a peer that answers each unread
  (`serve_bare`): the same chunking and window without the two checksum passes.
`raw_chunks(source, chunk_bytes)` splits a KV tensor's bytes as a `raw` transfer's chunk plan does,
`raw_chunk_frames` further into the frames each chunk travels as (frames of whole planes, <= 1 MiB);
`int8_wire_chunks(source, chunk_bytes)` are random bytes in the sizes an `int8` transfer sends.
`run_chunking_floor(endpoints, sources, quantizer, chunk_bytes, repeats)` times FLOOR_CASES (bare,
bare in the chunks' frames, chunked without and with checksums, pdbus's raw+none) back to back in
every round (its own pass: see its docstring), and
`print_chunking_floor` prints them as bench-kv's table. `run_link_floor(...)` /
`print_link_floor(...)` do the same for a shaped link: the chunked baseline with raw's chunks and
with int8-sized ones, beside pdbus's raw+none and int8+auto through the same link.

Why the second one: the target "raw+none reaches 80 % of a bare send" compares a protocol that
chunks, acknowledges and checksums (the issue asks for all three) with one message. The floor pass
takes it one step at a time: the bare message (its frames as bench-kv's bare send cuts them, 30 of
them); the same message cut into the chunks, a frame each (as protocol version 1 sent them), and
into the chunks' frames of at most 1 MiB (as version 2 does); those frames as one message a chunk,
answered in the window; a checksum on both sides; and pdbus's raw+none. From the third case on,
each adds one thing to the one before, so the step says what that thing costs on this machine,
where the two processes' main threads and their two I/O threads share two cores, and the last step
how much pdbus's own code adds. Ad hoc, in plain pyzmq: the frame size alone moved a bf16 cache's
bare send by a fifth (3.75 MiB frames against 0.75 MiB ones); acknowledgements within a window of
four cost little; xxh3_64 on both sides cost a third (loopback TCP's copies already keep both cores
busy, so every pass over the bytes adds its time). Cutting pdbus's chunks into frames (protocol 2)
sped up its raw transfers over CURVE, not plain ones: those are bound by the two checksum passes.
Why the link floor: on the shaped link the int8 targets are ratios of two times that each include
the wire; sending int8-sized chunks that need no encoding and no decoding says how large that
ratio can get on this link model at all, and so how much of it the codec's own time costs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, cast

import numpy as np
import zmq
import zmq.asyncio

from bus.kv import KVSender, SendConfig
from bus.kv.chunk_codec import payload_checksum
from bus.kv.layout import KVInfo, chunk_bytes_for, plan_chunks
from bus.kv.link import LinkShaper
from bus.kv.quant import Quantizer, frame_specs_of, payload_sizes

if TYPE_CHECKING:   # torch only where a sender splits a tensor: the peer process does without it
    import torch


WINDOW = 4   # unanswered chunks, as bench-kv's KVSenders are configured
SEND_CONFIG = SendConfig(window=WINDOW, ack_timeout=5.0, transfer_timeout=60.0)   # bench-kv's KVSenders


class ChecksumMismatch(RuntimeError):
    """The peer of the chunked baseline found a chunk that does not match its checksum."""


def flat_bytes(source: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as one uint8 numpy view (no copy of a contiguous tensor)."""
    import torch
    return source.contiguous().view(torch.uint8).numpy().reshape(-1)


def _info(source: torch.Tensor) -> KVInfo:
    from nodes.engines.kv_device import TORCH_DTYPES  # imports torch: only a sender splits tensors
    # KV is 5-D (layers, 2, kv_heads, tokens, head_dim); KVInfo checks the length itself
    return KVInfo(cast("tuple[int, int, int, int, int]", tuple(source.shape)), TORCH_DTYPES[source.dtype])


def int8_wire_chunks(source: torch.Tensor, chunk_bytes: int) -> list[np.ndarray]:
    """Random bytes as many as each chunk of an `int8` transfer of the source puts on the wire
    (codes and float16 params; headers left out): that transfer's traffic, with nothing encoded."""
    info = _info(source)
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, sum(payload_sizes("int8", spec, info, "f16")), dtype=np.uint8)
            for spec in plan_chunks(info, chunk_bytes_for(info, "int8", chunk_bytes))]


def bare_frames(source: torch.Tensor) -> list[np.ndarray]:
    """The source's bytes as the bare send carries them: one message of 30 frames (views, no copy)."""
    return np.array_split(flat_bytes(source), 30)


def raw_chunks(source: torch.Tensor, chunk_bytes: int) -> list[np.ndarray]:
    """Views of the source's bytes, one per chunk of a `raw` transfer of it (whole planes)."""
    info = _info(source)
    flat = flat_bytes(source)
    plane_bytes = info.num_tokens * info.head_dim * info.itemsize
    specs = plan_chunks(info, chunk_bytes_for(info, "raw", chunk_bytes))
    if any(spec.tokens != slice(0, info.num_tokens) for spec in specs):
        raise ValueError("the baseline splits whole planes only (a plane is larger than a chunk)")
    return [flat[spec.planes.start * plane_bytes:spec.planes.stop * plane_bytes] for spec in specs]


def raw_chunk_frames(source: torch.Tensor, chunk_bytes: int) -> list[list[np.ndarray]]:
    """Views of the source's bytes as the payload frames of each chunk of a `raw` transfer of it
    (quant.frame_specs_of: consecutive row ranges), one list a chunk."""
    info = _info(source)
    flat, row_bytes = flat_bytes(source), info.head_dim * info.itemsize

    def view(part):
        start = (part.plane_start * info.num_tokens + part.token_start) * row_bytes
        return flat[start:start + part.num_rows * row_bytes]

    return [[view(part) for part in frame_specs_of("raw", spec, info)]
            for spec in plan_chunks(info, chunk_bytes_for(info, "raw", chunk_bytes))]


def _frames_of(chunk: np.ndarray | list[np.ndarray]) -> list[np.ndarray]:
    return [chunk] if isinstance(chunk, np.ndarray) else list(chunk)


def _checksum(frames: list) -> bytes:
    """The chunk's checksum as pdbus computes it (chunk_codec.payload_checksum), as 8 bytes."""
    return payload_checksum(frames).to_bytes(8, "little")


async def pdbus_send(sender: KVSender, endpoint: str, transfer_id: str, source, mode: str, compression: str,
                     link: float | None = None):
    """(seconds, report) of one KVSender transfer, through a fresh shaped link of `link` bytes/s when
    given (each transfer starts on an idle wire), else straight over the socket."""
    sender.shaper = LinkShaper(link) if link else None
    started = time.perf_counter()
    report = await sender.send(endpoint, transfer_id, "bench", source, mode=mode, compression=compression)
    return time.perf_counter() - started, report


async def bare_send_seconds(socket: zmq.asyncio.Socket, frames: list) -> float:
    """One zero-copy multipart send of the same bytes and the peer's one-frame answer."""
    started = time.perf_counter()
    await socket.send_multipart(frames, copy=False)
    await socket.recv_multipart()
    return time.perf_counter() - started


async def chunked_send_seconds(socket: zmq.asyncio.Socket, chunks: list, window: int,
                               shaper: LinkShaper | None = None, checksum: bool = True) -> float:
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    queued: deque[tuple[float, list]] = deque()   # (release time, chunk's frames), admitted by the window
    num_admitted = num_answered = 0
    while num_answered < len(chunks):
        while num_admitted < len(chunks) and num_admitted - num_answered < window:
            # As KVSender's link does: a chunk's place on the virtual wire is booked when it is
            # admitted, so a late wake-up delays that chunk and not the ones behind it.
            chunk = _frames_of(chunks[num_admitted])
            nbytes = sum(frame.nbytes for frame in chunk)
            queued.append((shaper.release_time(nbytes, loop.time()) if shaper else 0.0, chunk))
            num_admitted += 1
        if queued:
            release, chunk = queued.popleft()
            frames = [_checksum(chunk), *chunk] if checksum else chunk
            if release > loop.time():
                await asyncio.sleep(release - loop.time())
            await socket.send_multipart(frames, copy=False)
            if not await socket.poll(0):   # flags default to POLLIN (pyzmq's stub omits the argument)
                continue
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
    """Answer each [checksum, payload frames...] message "ok" once its payload matches, else "bad"."""
    while True:
        frames = await socket.recv_multipart(copy=False)
        matches = len(frames) >= 3 and _checksum([f.buffer for f in frames[2:]]) == frames[1].bytes
        await socket.send_multipart([frames[0], b"ok" if matches else b"bad"])


# From the third on, each case is the one before it plus one thing (the module docstring).
FLOOR_CASES = ["bare pyzmq", "bare, a frame a chunk", "bare, chunk frames", "chunked, no checksum", "chunked pyzmq",
               "raw+none"]
FLOOR_LABELS = {"bare pyzmq": "bare (30 frames)", "bare, a frame a chunk": "a frame a chunk (protocol 1)",
                "bare, chunk frames": "the chunks' frames (protocol 2)",
                "chunked, no checksum": "a message a chunk, answered", "chunked pyzmq": "+ xxh3_64 both sides",
                "raw+none": "pdbus raw+none"}


async def run_chunking_floor(endpoints: dict, sources: dict, quantizer: Quantizer, chunk_bytes: int,
                             repeats: int) -> dict:
    """Best-of-N seconds of each of FLOOR_CASES per source, back to back in every round (in turn
    first). A pass of its own, after the main ones:
    run inside their rounds, the baseline's checksum pass left the source in cache for whichever
    case came next, and moved raw+none and the auto / none pairs by more than the targets' margins."""
    sender = KVSender(quantizer=quantizer, chunk_bytes=chunk_bytes, config=SEND_CONFIG)
    context = zmq.asyncio.Context.instance()
    bare, checked = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    bare.connect(endpoints["bare"])
    checked.connect(endpoints["checked"])
    times: dict[tuple[str, str], list[float]] = {}
    for name, source in sources.items():
        frames = bare_frames(source)
        whole, chunks = raw_chunks(source, chunk_bytes), raw_chunk_frames(source, chunk_bytes)
        for round_ in range(repeats + 1):   # round 0 warms up
            turn = round_ % len(FLOOR_CASES)
            for case in FLOOR_CASES[turn:] + FLOOR_CASES[:turn]:
                started = time.perf_counter()
                if case == "bare pyzmq":
                    await bare_send_seconds(bare, frames)
                elif case == "bare, a frame a chunk":
                    await bare_send_seconds(bare, whole)
                elif case == "bare, chunk frames":
                    await bare_send_seconds(bare, [frame for chunk in chunks for frame in chunk])
                elif case == "chunked, no checksum":
                    await chunked_send_seconds(bare, chunks, WINDOW, checksum=False)
                elif case == "chunked pyzmq":
                    await chunked_send_seconds(checked, chunks, WINDOW)
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
    """Not a target: what chunking, answering and checksumming cost by themselves, one step at a
    time, and how much pdbus's own code adds to them (FLOOR_CASES)."""
    print("\n### From a bare send to raw+none, one step at a time, in plain pyzmq (loopback; not a target)\n\n"
          "The same bytes as one message cut three ways (30 frames; a frame a chunk, as protocol 1 sent them; the "
          "chunks' frames of protocol 2), then each column adds one thing to the one before: a message a chunk "
          "answered within the same window, xxh3_64 on both sides, pdbus itself. A pass of its own, the cases back "
          "to back in every round, best of N; ms, and in brackets the throughput against the bare send.\n")
    print("| source | " + " | ".join(FLOOR_LABELS[case] for case in FLOOR_CASES) + " |\n|---|"
          + "---:|" * len(FLOOR_CASES))
    for name in dict.fromkeys(name for name, _ in floor):
        bare = floor[name, FLOOR_CASES[0]]
        cells = [f"{floor[name, case] * 1e3:.1f} ({bare / floor[name, case]:.2f})" for case in FLOOR_CASES]
        print(f"| {name} | " + " | ".join(cells) + " |")


async def run_link_floor(endpoints: dict, sources: dict, chunk_bytes: int, repeats: int, link: float) -> dict:
    """Best-of-N seconds of the chunked baseline through a shaped link of `link` bytes/s, with the
    raw transfer's chunks and with random bytes the size of the int8 transfer's: per source, the
    two back to back in every round (in turn first). Their ratio is the most a transfer that sends
    int8's bytes instead of raw's can gain on this link model, encoding and decoding for free."""
    context = zmq.asyncio.Context.instance()
    checked = context.socket(zmq.DEALER)
    checked.connect(endpoints["checked"])
    times: dict[tuple[str, str], list[float]] = {}
    for name, source in sources.items():
        chunks: dict[str, list[list[np.ndarray]] | list[np.ndarray]] = {
            "raw-sized": raw_chunk_frames(source, chunk_bytes), "int8-sized": int8_wire_chunks(source, chunk_bytes)}
        for round_ in range(repeats + 1):   # round 0 warms up
            for case in (list(chunks) if round_ % 2 else list(chunks)[::-1]):
                seconds = await chunked_send_seconds(checked, chunks[case], WINDOW, LinkShaper(link))
                if round_:
                    times.setdefault((name, case), []).append(seconds)
    checked.close(linger=0)
    return {key: min(values) for key, values in times.items()}


def print_link_floor(floor: dict, shaped: dict, title: str) -> None:
    """Not a target: what the shaped link alone allows (run_link_floor) beside pdbus's raw+none and
    int8+auto through the same link (`shaped`, bench-kv's best-of-N results)."""
    print(f"\n### The {title} link alone, in plain pyzmq (not a target)\n\n"
          "The chunked baseline through the same shaper, window and timer as KVSender: raw's chunks, and random "
          "bytes the size of int8's (nothing encoded or decoded); best of N.\n\n"
          "| source | raw-sized ms | int8-sized ms | the most int8 can gain | pdbus raw+none ms "
          "| pdbus int8+auto ms | pdbus gain |\n|---|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(name for name, _ in floor):
        raw, int8 = floor[name, "raw-sized"], floor[name, "int8-sized"]
        pdbus_raw, pdbus_int8 = shaped[f"{name} raw+none"][0], shaped[f"{name} int8+auto"][0]
        print(f"| {name} | {raw * 1e3:.1f} | {int8 * 1e3:.1f} | {raw / int8:.2f}x | {pdbus_raw * 1e3:.1f} "
              f"| {pdbus_int8 * 1e3:.1f} | {pdbus_raw / pdbus_int8:.2f}x |")
