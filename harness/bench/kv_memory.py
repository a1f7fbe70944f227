"""`make bench-kv-memory`: what a decode engine's requests wait for KV memory, reserved at node
start (`preallocate_kv = true`, the default) vs allocated on demand, side by side in one run.

For each repetition, alternating which goes first, two fresh engines on the real model (bf16 by
default, one thread), each in a new process that has just loaded the model as a node has, take the
same requests, each importing a prompt's KV as after a remote
prefill (random values: the timing does not depend on them): the first request at the fresh
engine, then requests joining a running batch up to the one that grows the slot cache from 8 to 16
slots and the one that grows it to 24. Reported per event: best and median `add_request` ms of each
mode and their ratio (on demand / reserved), and what the reservation costs at start (ms, MiB).
An `add_request` that allocates stalls every running stream of the node for as long.
Run under `flock /tmp/pdbus-bench.lock` (the make target does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import DEFAULT_MODEL, load_model

MODEL_NAME = DEFAULT_MODEL

EVENTS = {0: "first request at a fresh engine", 8: "9th running request (8 -> 16 slots)",
          16: "17th running request (16 -> 24 slots)"}


def one_engine(model, dtype: str, reserved: bool, num_tokens: int, max_tokens: int) -> dict[str, float]:
    engine = LlamaEngine(model, EngineConfig(dtype=dtype, preallocate_kv=reserved))
    started = time.perf_counter()
    engine.reserve_kv_memory()
    times = {"reserve at start": (time.perf_counter() - started) * 1e3, "MiB": engine.slots.num_bytes / 2**20}
    kv = torch.randn(engine.kv_layout.shape(num_tokens)).to(engine.kv_layout.dtype)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(max(EVENTS) + 1):
        request = DecodeRequest(f"r{i}", tuple([1] * num_tokens), sampling, kv=kv, first_token_id=5)
        started = time.perf_counter()
        assert engine.add_request(request).ok
        if i in EVENTS:
            times[EVENTS[i]] = (time.perf_counter() - started) * 1e3
    return times


def child_run(args: argparse.Namespace, reserved: bool) -> dict[str, float]:
    command = [sys.executable, "-m", "harness.bench.kv_memory", "--one", "reserved" if reserved else "demand",
               "--dtype", args.dtype, "--tokens", str(args.tokens), "--max-tokens", str(args.max_tokens)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.kv_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens of each request")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=["reserved", "demand"], help=argparse.SUPPRESS)   # a child's run
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.one:
        model = load_model(dtype=torch.float32)
        print(json.dumps(one_engine(model, args.dtype, args.one == "reserved", args.tokens, args.max_tokens)))
        return 0
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for round_ in range(args.repeats):
        for reserved in ((True, False) if round_ % 2 == 0 else (False, True)):
            runs[reserved].append(child_run(args, reserved))
    print(f"# bench-kv-memory: {MODEL_NAME}, {args.dtype}, requests of {args.tokens} + {args.max_tokens} tokens, "
          f"KV imported; {args.repeats} fresh engines per mode, interleaved\n")
    print(f"reservation at start: {statistics.median(r['reserve at start'] for r in runs[True]):.0f} ms "
          f"(median), {runs[True][0]['MiB']:.0f} MiB (the slot budget)\n")
    print("| add_request | on demand ms (best / median) | reserved ms (best / median) | on demand / reserved (best) |")
    print("|---|---:|---:|---:|")
    for event in EVENTS.values():
        demand, upfront = ([r[event] for r in runs[m]] for m in (False, True))
        print(f"| {event} | {min(demand):.1f} / {statistics.median(demand):.1f} | {min(upfront):.1f} / "
              f"{statistics.median(upfront):.1f} | {min(demand) / min(upfront):.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
