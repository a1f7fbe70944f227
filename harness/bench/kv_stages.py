"""Per-stage throughput of the KV codec on real KV, in one process (part of `make bench-kv`).

Contract: `measure_stages(kv_fp32)` returns rows of (stage, GB/s of the engine's KV) for memcpy,
checksum, encode and decode of each mode on the numpy, numba (int8) and compiled torch paths; and
`measure_compression(kv_fp32)` returns, per payload kind and codec (with and without byte-plane
shuffle), the compression ratio and speed. Stage times are the best of `repeats` (as the end-to-end
figures: on a shared machine noise only ever adds time); compression times are medians.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch
import xxhash

from bus.kv.compress import compress_frame, decompress_frame
from bus.kv.layout import chunk_bytes_for, plan_chunks
from bus.kv.quant import NumpyQuantizer, max_payload_sizes
from nodes.engines.kv_quant import TorchQuantizer


def _timings(fn, repeats: int) -> list[float]:
    fn()   # warm-up: compile, fault pages in
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def median_seconds(fn, repeats: int = 5) -> float:
    return statistics.median(_timings(fn, repeats))


def best_seconds(fn, repeats: int = 7) -> float:
    return min(_timings(fn, repeats))


def _sources(kv_fp32: np.ndarray) -> dict[str, torch.Tensor]:
    """The real KV as the engine holds it in each dtype: float32 and bfloat16 torch tensors."""
    return {"fp32": torch.from_numpy(kv_fp32), "bf16": torch.from_numpy(kv_fp32).to(torch.bfloat16)}


def _chunks(quantizer, kv, mode, chunk_bytes):
    info = quantizer.kv_info(kv)
    specs = plan_chunks(info, chunk_bytes_for(info, mode, chunk_bytes))   # as the sender plans them
    outs = [np.empty(n, np.uint8) for n in max_payload_sizes(mode, max(s.num_rows for s in specs), info)]
    return info, specs, outs


def encode_seconds(quantizer, kv, mode, chunk_bytes, repeats):
    info, specs, outs = _chunks(quantizer, kv, mode, chunk_bytes)
    return best_seconds(lambda: [quantizer.encode(kv, info, s, mode, outs) for s in specs], repeats)


def decode_seconds(quantizer, kv, mode, dst, chunk_bytes, repeats):
    info, specs, outs = _chunks(quantizer, kv, mode, chunk_bytes)
    payloads = []
    for spec in specs:
        payload = quantizer.encode(kv, info, spec, mode, outs)
        payloads.append(([np.frombuffer(memoryview(f).cast("B"), np.uint8).copy() for f in payload.frames],
                         payload.scale_dtype))
    return best_seconds(lambda: [quantizer.decode(p, info, s, mode, scale, dst)
                                   for s, (p, scale) in zip(specs, payloads, strict=True)], repeats)


def measure_stages(kv_fp32: np.ndarray, torch_quantizer: TorchQuantizer, chunk_bytes: int,
                   repeats: int = 7) -> list[tuple[str, float]]:
    rows = []
    nbytes = kv_fp32.nbytes
    target = np.empty_like(kv_fp32)
    rows.append(("memcpy fp32 into a reused buffer", nbytes / best_seconds(lambda: np.copyto(target, kv_fp32), repeats)))
    # numpy's stubs give ndarray `__buffer__` (what makes it a Buffer) only for Python >= 3.12
    rows.append(("xxh3_64 checksum", nbytes / best_seconds(
        lambda: xxhash.xxh3_64_intdigest(kv_fp32), repeats)))  # type: ignore[arg-type]
    tensors = _sources(kv_fp32)
    fast_int8 = torch_quantizer.fast_int8
    for name, kv in tensors.items():
        size = kv.numel() * kv.element_size()
        dst = torch.empty_like(kv)
        # int8 twice: the numba kernels pdbus uses, and the torch.compile kernels they replaced
        for mode, fast in (("bf16", False), ("int8", True), ("int8", False), ("int8_sym", False)):
            if (name == "bf16" and mode != "int8") or (fast and not fast_int8):
                continue
            torch_quantizer.fast_int8 = fast
            path = "numba" if fast else "torch compiled"
            rows.append((f"encode {mode} from {name} ({path})",
                         size / encode_seconds(torch_quantizer, kv, mode, chunk_bytes, repeats)))
            rows.append((f"decode {mode} into {name} ({path})",
                         size / decode_seconds(torch_quantizer, kv, mode, dst, chunk_bytes, repeats)))
        torch_quantizer.fast_int8 = fast_int8
    numpy_quantizer, array_dst = NumpyQuantizer(), np.empty_like(kv_fp32)
    for mode in ("int8", "bf16"):
        rows.append((f"encode {mode} from fp32 (numpy reference)",
                     nbytes / encode_seconds(numpy_quantizer, kv_fp32, mode, chunk_bytes, 3)))
        rows.append((f"decode {mode} into fp32 (numpy reference)",
                     nbytes / decode_seconds(numpy_quantizer, kv_fp32, mode, array_dst, chunk_bytes, 3)))
    return [(stage, value / 1e9) for stage, value in rows]


def payload_samples(kv_fp32: np.ndarray, torch_quantizer: TorchQuantizer, chunk_bytes: int) -> dict[str, list]:
    """The payload frames each mode puts on the wire for the real KV, by kind."""
    samples: dict[str, list] = {}
    kv = torch.from_numpy(kv_fp32)
    for label, source, mode in (("raw fp32", kv, "raw"), ("raw bf16", kv.to(torch.bfloat16), "raw"),
                                ("int8 (codes + params)", kv, "int8")):
        info, specs, outs = _chunks(torch_quantizer, source, mode, chunk_bytes)
        frames = []
        for spec in specs:
            payload = torch_quantizer.encode(source, info, spec, mode, outs)
            frames.append([bytes(memoryview(f).cast("B")) for f in payload.frames])
        samples[label] = frames
    return samples


def measure_compression(samples: dict[str, list], itemsizes: dict[str, int]) -> list[tuple[str, str, float, float, float]]:
    """(payload, codec, ratio, compress GB/s, decompress GB/s) for each payload kind and codec."""
    rows = []
    for label, chunks in samples.items():
        raw = sum(len(f) for frames in chunks for f in frames)
        for codec, shuffle in (("lz4", 0), ("zstd", 0), ("lz4", itemsizes[label]), ("zstd", itemsizes[label])):
            if shuffle == 1:
                continue
            started = time.perf_counter()
            wires = [[compress_frame(f, codec, shuffle if i == 0 else 0) for i, f in enumerate(frames)] for frames in chunks]
            compress = time.perf_counter() - started
            started = time.perf_counter()
            for frames, wire in zip(chunks, wires, strict=True):
                for i, (f, w) in enumerate(zip(frames, wire, strict=True)):
                    decompress_frame(w, codec, shuffle if i == 0 else 0, len(f))
            decompress = time.perf_counter() - started
            wire_bytes = sum(len(w) for wire in wires for w in wire)
            name = codec + (f"+shuffle{shuffle}" if shuffle else "")
            rows.append((label, name, raw / wire_bytes, raw / compress / 1e9, raw / decompress / 1e9))
    return rows


def auto_overhead(kv_fp32: np.ndarray, torch_quantizer: TorchQuantizer, chunk_bytes: int,
                  link_bytes_per_s: float, rounds: int = 40) -> list[tuple[str, float, float]]:
    """Sender CPU time of whole transfers (quantize, checksum, compress or sample, header) with
    `auto` vs `none`, interleaved, best of `rounds`: when `auto` stores, the wire carries the same
    bytes, so this CPU difference is the whole difference end to end, measured without the noise
    of two processes and a socket. Both write into the same encode buffers, as the sender's
    BufferPool reuses them across transfers, and take turns going first: fresh buffers per run
    (their page faults) and a fixed order had put 1.05-1.11 on work that differs by one sample
    every 32 chunks in the 21:38 run."""
    from bus.kv.chunk_codec import ChunkEncoder
    from bus.kv.compress import AutoCompression

    auto = AutoCompression(link_bytes_per_s)
    rows = []
    for name, kv in _sources(kv_fp32).items():
        for mode in ("int8", "raw"):
            best: dict[str, float] = {}
            outs = None
            for round_ in range(rounds):
                for compression in ("none", "auto") if round_ % 2 else ("auto", "none"):
                    encoder = ChunkEncoder(kv, torch_quantizer, transfer_id="t", request_id="r", mode=mode,
                                           compression=compression, chunk_bytes=chunk_bytes, auto=auto)
                    outs = outs or [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
                    started = time.perf_counter()
                    for index in range(encoder.num_chunks):
                        encoder.encode(index, outs)
                    seconds = time.perf_counter() - started
                    best[compression] = min(best.get(compression, seconds), seconds)
            rows.append((f"{name} {mode}", best["auto"] / best["none"], best["none"]))
    return rows


def destination_cost(kv_fp32: np.ndarray, torch_quantizer: TorchQuantizer, chunk_bytes: int,
                     rounds: int = 15) -> list[tuple[str, float, float, float | None]]:
    """Receiver CPU of whole transfers (verify + decode of every chunk) into a new tensor per
    transfer vs a buffer of the decode node's pool (nodes/kv_buffers.py), and for raw also kept
    as its frames (bus/kv/pieces.py, what a decode node does), interleaved, best of `rounds`:
    (source and mode, new ms, pooled ms, kept ms or None). A new tensor of more than 32 MiB comes
    from fresh pages: glibc serves it with mmap."""
    from bus.kv.chunk_codec import ChunkEncoder, decode, verify
    from bus.kv.pieces import RawPieces
    from nodes.kv_buffers import KVBufferPool

    pool = KVBufferPool()
    rows = []
    for name, kv in _sources(kv_fp32).items():
        for mode in ("int8", "raw"):
            encoder = ChunkEncoder(kv, torch_quantizer, transfer_id="t", request_id="r", mode=mode,
                                   compression="none", chunk_bytes=chunk_bytes)
            outs = [np.empty(n, np.uint8) for n in encoder.buffer_sizes()]
            chunks = []
            for index in range(encoder.num_chunks):
                header, wire = encoder.encode(index, outs)
                chunks.append((header, [np.frombuffer(memoryview(w).cast("B"), np.uint8).copy() for w in wire]))

            def receive(dst, chunks=chunks) -> None:
                for header, wire in chunks:
                    decode(header, verify(header, wire), torch_quantizer, dst)

            kinds = ("new", "pooled", "kept") if mode == "raw" else ("new", "pooled")
            best: dict[str, float] = {}
            for round_ in range(rounds + 1):   # round 0 warms up (and fills the pool)
                for kind in kinds[round_ % len(kinds):] + kinds[:round_ % len(kinds)]:
                    dst = (torch.empty_like(kv) if kind == "new" else RawPieces(encoder.info) if kind == "kept"
                           else pool.take(tuple(kv.shape), kv.dtype))
                    started = time.perf_counter()
                    receive(dst)
                    seconds = time.perf_counter() - started
                    if kind == "pooled":
                        assert isinstance(dst, torch.Tensor)   # pool.take's buffer
                        pool.give(dst)
                    if round_:
                        best[kind] = min(best.get(kind, seconds), seconds)
            kept = best["kept"] * 1e3 if "kept" in best else None
            rows.append((f"{name} {mode}", best["new"] * 1e3, best["pooled"] * 1e3, kept))
    return rows
