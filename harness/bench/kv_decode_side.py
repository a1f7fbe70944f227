"""The decode-side process of the KV benchmark and integration tests.

Run as `python -m harness.bench.kv_decode_side [--torch] [--faults SEED]`: binds a KV data endpoint (a
`KVReceiver` writing into one preallocated destination per dtype, as an engine's KV pool would;
`raw` transfers are kept as their verified frames, RawPieces, as a decode node keeps them; and its
heap is set up as a decode node's, nodes.heap.configure_decode_heap)
and two plain pyzmq ROUTERs for the baselines (harness/bench/kv_baselines.py: "bare" answers every
message, "checked" verifies each chunk's checksum first), prints one JSON line
{"kv": endpoint, "bare": endpoint, "checked": endpoint} and serves until stdin closes. With PDBUS_BENCH_CURVE_KEYS in
the environment (bench-kv --curve) a second receiver speaks CURVE: {"kv_curve": endpoint} too. Every KV result is printed as a
JSON line too (ok, transfer id, a checksum of the destination for raw round-trip checks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import numpy as np
import xxhash
import zmq
import zmq.asyncio

from bus.kv import FaultInjector, KVReceiver, RawPieces, ReceiveConfig
from bus.kv.layout import DTYPES
from harness.bench.kv_baselines import serve_bare, serve_checked


def make_allocator(use_torch: bool, device: str = "cpu"):
    pool: dict[tuple, object] = {}

    def allocate(transfer_id, request_id, info, mode):
        if mode == "raw":   # as a decode node does: the verified frames are the KV (bus/kv/pieces.py)
            return RawPieces(info)
        key = (info.shape, info.dtype)
        if key not in pool:
            if use_torch:
                import torch

                from nodes.engines.kv_device import NAMES_TO_TORCH
                pool[key] = torch.zeros(info.shape, dtype=NAMES_TO_TORCH[info.dtype], device=device)
            else:
                pool[key] = np.zeros(info.shape, DTYPES[info.dtype])
        return pool[key]
    return allocate


def digest(kv) -> int:
    if isinstance(kv, RawPieces):
        kv = kv.to_numpy()
    if hasattr(kv, "numpy"):
        import torch
        kv = kv.view(torch.int16).numpy() if kv.dtype == torch.bfloat16 else kv.numpy()
    # numpy's stubs give ndarray `__buffer__` (what makes it a Buffer) only for Python >= 3.12
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(kv).view(np.uint8))  # type: ignore[arg-type]


def land_raw(pieces: RawPieces, device: str):
    """A raw transfer's verified frames copied onto the device, as a GPU engine's admission copies
    them into its slot cache (kv_landing.copy_pieces), and waited for; returns that copy."""
    import torch

    from nodes.engines.kv_device import NAMES_TO_TORCH
    from nodes.engines.kv_landing import copy_pieces
    destination = torch.empty(pieces.info.shape, dtype=NAMES_TO_TORCH[pieces.info.dtype], device=device)
    copy_pieces(pieces, destination)
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return destination


async def main(args: argparse.Namespace) -> None:
    from nodes.heap import configure_decode_heap
    configure_decode_heap()   # the heap of a decode node: received frames are reused, not faulted in afresh
    quantizer = None
    if args.torch:
        import torch

        from nodes.engines.kv_quant import TorchQuantizer
        torch.set_num_threads(1)
        quantizer = TorchQuantizer(on_device=args.device != "cpu")
        if not args.no_warmup:
            quantizer.warmup()
    faults = FaultInjector(drop_probability=0.2, seed=args.faults) if args.faults is not None else None

    def report(result):
        if quantizer is not None:
            quantizer.device_landing.synchronize()   # as a decode node does before the engine reads it
            if args.device != "cpu" and result.ok and isinstance(result.kv, RawPieces):
                land_raw(result.kv, args.device)   # raw lands when the engine copies its frames in
        line = {"transfer_id": result.transfer_id, "ok": result.ok, "reason": result.reason,
                "checksum_failures": result.stats.checksum_failures, "nacks": result.stats.nacks,
                "digest": digest(result.kv) if result.ok and args.digests else None}
        print(json.dumps(line), flush=True)

    receiver = KVReceiver(make_allocator(args.torch, args.device), quantizer=quantizer, faults=faults, on_result=report,
                          config=ReceiveConfig(transfer_timeout=args.timeout))
    endpoint = await receiver.start()
    endpoints = {"kv": endpoint}
    curve_receiver = None
    if os.environ.get("PDBUS_BENCH_CURVE_KEYS"):
        from harness.bench.bus_bench import curve_configs
        security = curve_configs(json.loads(os.environ["PDBUS_BENCH_CURVE_KEYS"]))[0]
        curve_receiver = KVReceiver(make_allocator(args.torch), quantizer=quantizer, on_result=report,
                                    config=ReceiveConfig(transfer_timeout=args.timeout), security=security)
        endpoints["kv_curve"] = await curve_receiver.start()
    context = zmq.asyncio.Context.instance()
    baselines = {"bare": serve_bare, "checked": serve_checked}
    sockets, tasks = {}, []
    for name, serve in baselines.items():
        sockets[name] = context.socket(zmq.ROUTER)
        sockets[name].bind("tcp://127.0.0.1:0")
        tasks.append(asyncio.get_running_loop().create_task(serve(sockets[name])))
        endpoints[name] = sockets[name].getsockopt_string(zmq.LAST_ENDPOINT)
    print(json.dumps(endpoints), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)   # until stdin closes
    for task in tasks:
        task.cancel()
    await receiver.close()
    if curve_receiver is not None:
        await curve_receiver.close()
    for socket in sockets.values():
        socket.close(linger=0)


if __name__ == "__main__":
    os.environ.setdefault("PDBUS_LOG_LEVEL", "warning")
    parser = argparse.ArgumentParser()
    parser.add_argument("--torch", action="store_true", help="decode with the compiled torch quantizer")
    parser.add_argument("--faults", type=int, default=None, help="drop 20%% of replies (seeded)")
    parser.add_argument("--digests", action="store_true", help="print a digest of each received KV")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--device", default="cpu", help="destinations on this torch device, decoded there (with --torch)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="compile kernels at first use, not at start (a caller that warms up itself)")
    from bus.log import configure_logging
    configure_logging(level=os.environ["PDBUS_LOG_LEVEL"])
    try:
        import uvloop
        uvloop.run(main(parser.parse_args()))
    except KeyboardInterrupt:
        pass
