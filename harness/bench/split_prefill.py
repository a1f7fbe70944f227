"""How fast could one prompt prefill if its layers were split across the two cores' processes?
(`make bench-split`): the bound on a layer-pipelined prefill, beside one process using both cores
(how vLLM's server prefills on two cores) and one process on one core (a pdbus prefill node).

Contract: three worker processes load the model once (`--model`, `--dtype`, default auto):
- `one core`: pinned to CPU 0, one torch thread, the whole prompt in one forward pass;
- `two threads`: on both CPUs, two torch threads, the same pass;
- `split C`: CPU 0's worker runs layers [0, L/2) of the prompt in C chunks and sends each chunk's
  hidden states through a pipe to CPU 1's worker, which runs [L/2, L) on each as it arrives and
  then the logits: the time from the first chunk's start to the logits (CLOCK_MONOTONIC in both).
For each prompt length (`--lengths`) every system runs once a round, interleaved over `--rounds`;
the medians print with their ratio to `one core`, and `--json PATH` writes them. The second
worker is idle between chunks: a decode node would interleave its decode steps there, so `split`
is a lower bound on what the design could serve. Linux only (sched_setaffinity).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

SPLIT_CHUNKS = (1, 2, 4, 8)


def worker(cpus: set[int], threads: int, model: str, dtype_name: str, control: Connection,
           peer: Connection | None) -> None:
    """Serve commands from `control` until None: ("whole", n) -> seconds; ("first", n, C) -> start
    time (sends C hidden-state chunks to `peer`); ("second", n, C) -> end time (reads them)."""
    import os

    import torch

    from nodes.engines.engine_common import resolve_dtype
    from nodes.engines.llama import LlamaRunner
    from nodes.engines.model_loader import load_model

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    dtype = resolve_dtype(dtype_name)
    loaded = load_model(model, dtype=dtype)
    runner = LlamaRunner(loaded.config, loaded.weights, dtype=dtype)
    half = runner.config.num_layers // 2
    control.send("ready")
    with torch.inference_mode():   # as `forward` runs every step: run_layers and head enter none
        while (command := control.recv()) is not None:
            kind, num_tokens, *chunks = command
            prompt = torch.arange(num_tokens) % 30_000 + 100
            kv = runner.new_kv(num_tokens)
            if kind == "whole":
                start = time.monotonic()
                runner.forward(_batch(prompt, kv, 0, num_tokens))
                control.send(time.monotonic() - start)
            elif kind == "first":
                assert peer is not None   # the split's first worker has its peer
                control.send(time.monotonic())
                for begin, size in _chunks(num_tokens, chunks[0]):
                    batch = _batch(prompt, kv, begin, size)
                    hidden = runner.run_layers(runner.embed[batch.token_ids], batch, range(half))
                    peer.send_bytes(hidden.contiguous().view(torch.uint8).numpy().tobytes())   # a wire's copy
            else:
                assert peer is not None
                for begin, size in _chunks(num_tokens, chunks[0]):
                    batch = _batch(prompt, kv, begin, size)
                    received = torch.frombuffer(bytearray(peer.recv_bytes()), dtype=torch.uint8)
                    hidden = received.view(dtype).view(size, -1)
                    x = runner.run_layers(hidden, batch, range(half, runner.config.num_layers))
                runner.head(x, batch)
                control.send(time.monotonic())


def _chunks(num_tokens: int, count: int) -> list[tuple[int, int]]:
    size = -(-num_tokens // count)
    return [(begin, min(size, num_tokens - begin)) for begin in range(0, num_tokens, size)]


def _batch(prompt: Any, kv: Any, begin: int, size: int) -> Any:
    import torch

    from nodes.engines.forward_batch import ForwardBatch, PrefillSpan
    last = begin + size == len(prompt)
    rows = torch.tensor([size - 1]) if last else torch.tensor([], dtype=torch.long)
    return ForwardBatch(prompt[begin:begin + size], torch.arange(begin, begin + size), rows,
                        spans=[PrefillSpan(0, size, begin, kv)])


class Workers:
    """The three workers, each behind its control pipe."""

    def __init__(self, model: str, dtype_name: str) -> None:
        ctx = mp.get_context("spawn")
        first_end, second_end = ctx.Pipe()
        self.controls: dict[str, Connection] = {}
        self.procs: list[Any] = []
        for name, cpus, threads, peer in (("one core", {0}, 1, first_end), ("second", {1}, 1, second_end),
                                          ("two threads", {0, 1}, 2, None)):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(cpus, threads, model, dtype_name, theirs, peer), daemon=True)
            proc.start()
            self.controls[name], self.procs = mine, [*self.procs, proc]
        for control in self.controls.values():
            if control.recv() != "ready":
                raise RuntimeError("a worker did not start")

    def whole(self, name: str, num_tokens: int) -> float:
        self.controls[name].send(("whole", num_tokens))
        return float(self.controls[name].recv())

    def split(self, num_tokens: int, chunks: int) -> float:
        self.controls["second"].send(("second", num_tokens, chunks))
        self.controls["one core"].send(("first", num_tokens, chunks))
        start = float(self.controls["one core"].recv())
        return float(self.controls["second"].recv()) - start

    def close(self) -> None:
        for control in self.controls.values():
            control.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def measure(workers: Workers, lengths: list[int], rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per system and prompt length, every system once a round (after one warm-up)."""
    systems = ["one core", "two threads"] + [f"split {c}" for c in SPLIT_CHUNKS]
    samples: dict[str, dict[str, list[float]]] = {str(n): {s: [] for s in systems} for n in lengths}
    for round_index in range(rounds + 1):
        for n in lengths:
            for system in systems:
                seconds = (workers.split(n, int(system.split()[1])) if system.startswith("split")
                           else workers.whole(system, n))
                if round_index:   # round 0 warms each shape up
                    samples[str(n)][system].append(seconds)
    return {n: {s: statistics.median(v) for s, v in by.items()} for n, by in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lengths", default="256,512,972", help="prompt lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the medians here")
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    workers = Workers(args.model, args.dtype)
    try:
        medians = measure(workers, lengths, args.rounds)
    finally:
        workers.close()
    print(f"prefill of one prompt, median of {args.rounds} rounds, ms (ratio to one core)")
    for n, by in medians.items():
        base = by["one core"]
        print(f"  {n:>5} tokens: " + "  ".join(f"{s} {v * 1e3:.0f} ({v / base:.2f}x)" for s, v in by.items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"model": args.model, "dtype": args.dtype, "rounds": args.rounds, "seconds": medians}, out,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
