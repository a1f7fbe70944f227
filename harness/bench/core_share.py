"""Do this machine's two CPUs share one physical core's matrix units? (`make bench-lend` runs it.)

A prefill node and a decode node are pinned to one CPU each. On a VM whose two vCPUs are the two
hyperthreads of one host core, they share that core's AMX tiles or FMA units: a second process
busy multiplying halves the first one's rate, and "two cores" hold one core's compute. This
probe measures one thread's matmul rate (bf16 and fp32, 1024^3) on CPU 0 alone and with CPU 1
running the same products in another process (stopped and continued, in interleaved pairs of
rounds), and prints the medians and the ratio of each pair (~1.0: separate cores; ~0.5: one core's
units shared). `--json PATH` also writes them. Linux only (sched_setaffinity).
Run under `flock /tmp/pdbus-bench.lock`: any other load on the machine spoils the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

SIZE = 1024
ROUNDS, REPEATS = 3, 20
PAIRS = 5
LOAD_SECONDS = 600   # the loader's bound, should its parent die without killing it


def operands(dtype_name: str, size: int) -> tuple[Any, Any]:
    """One thread, two square matrices: the product both the timed and the loading process run."""
    import torch
    torch.set_num_threads(1)
    a = torch.randn(size, size, dtype=getattr(torch, dtype_name))
    return a, a.clone()


def matmul_tflops(dtype_name: str) -> float:
    """One thread's best rate over ROUNDS of REPEATS products on the calling process's CPU."""
    a, b = operands(dtype_name, SIZE)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(REPEATS):
            a @ b
        best = min(best, (time.perf_counter() - start) / REPEATS)
    return 2 * SIZE**3 / best / 1e12


def load(cpu: int, dtype_name: str, size: int) -> None:
    """The loading process: multiply on `cpu` until killed (or LOAD_SECONDS), after one line saying so."""
    os.sched_setaffinity(0, {cpu})
    a, b = operands(dtype_name, size)
    a @ b
    print("multiplying", flush=True)
    end = time.monotonic() + LOAD_SECONDS
    while time.monotonic() < end:
        a @ b


def measure(dtype_name: str, own_cpu: int, other_cpu: int) -> dict[str, Any]:
    """PAIRS interleaved rounds, each alone (the loader stopped) then beside it (running): this
    machine's rate drifts by 2x within a minute, so only side by side rounds compare."""
    os.sched_setaffinity(0, {own_cpu})
    loader = subprocess.Popen([sys.executable, "-m", "harness.bench.core_share", "--load-on", str(other_cpu),
                               "--dtypes", dtype_name, "--size", str(SIZE)], stdout=subprocess.PIPE, text=True)
    alone, beside = [], []
    try:
        if loader.stdout is None or loader.stdout.readline().strip() != "multiplying":
            raise RuntimeError("core_share: the loading process did not start")
        for _ in range(PAIRS):
            loader.send_signal(signal.SIGSTOP)
            alone.append(matmul_tflops(dtype_name))
            loader.send_signal(signal.SIGCONT)
            time.sleep(0.2)
            beside.append(matmul_tflops(dtype_name))
    finally:
        loader.kill()
        loader.wait()
    ratios = [b / a for a, b in zip(alone, beside, strict=True)]
    return {"alone_tflops": round(statistics.median(alone), 3), "beside_tflops": round(statistics.median(beside), 3),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--load-on", type=int, help=argparse.SUPPRESS)   # the loading process's mode
    parser.add_argument("--size", type=int, default=SIZE, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load_on is not None:
        load(args.load_on, args.dtypes, args.size)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print("core_share: needs two CPUs", file=sys.stderr)
        return 2
    found = {name: measure(name, cpus[0], cpus[1]) for name in args.dtypes.split(",")}
    for name, row in found.items():
        print(f"{name} matmul {SIZE}^3, one thread on CPU {cpus[0]}: {row['alone_tflops']:.2f} TFLOP/s alone, "
              f"{row['beside_tflops']:.2f} with CPU {cpus[1]} multiplying too (median of {len(row['ratios'])} "
              f"interleaved pairs: {row['ratio']:.2f}x; each {', '.join(f'{r:.2f}' for r in row['ratios'])})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cpus": cpus[:2], "size": SIZE, "dtypes": found}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
