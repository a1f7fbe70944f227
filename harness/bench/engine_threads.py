"""The thread study of `make bench-engine`: decode steps of one or two engine processes on this
machine's cores, under OpenMP's default wait policy and under OMP_WAIT_POLICY=PASSIVE.

Contract: `thread_study(dtype_name, batch, seconds, rounds=2)` runs every (wait policy, layout of
THREAD_LAYOUTS: processes x torch threads each) `rounds` times, interleaved, prints each one's
median decode step and returns key -> every process's median step (ms); `run_layout(...)` is one
such run: each process (THREAD_WORKER, a fresh interpreter loading the model) adds `batch`
decode requests, each with 512 tokens of random KV, warms up, then all step together for `seconds`.
"""

from __future__ import annotations

import os
import subprocess
import sys

THREAD_WORKER = """
import sys, time, torch
from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import load_model
dtype, batch, seconds, threads = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
engine = LlamaEngine(load_model(), EngineConfig(dtype=dtype, num_threads=threads))
layout = engine.kv_layout
for i in range(batch):
    kv = torch.randn(layout.shape(512), dtype=layout.dtype)
    engine.add_request(DecodeRequest(str(i), (5,) * 512, SamplingParams(temperature=0, max_tokens=4096,
                                     ignore_eos=True), kv=kv, first_token_id=7))
for _ in range(3):
    engine.step()
print("READY", flush=True)
sys.stdin.readline()
times = []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    t0 = time.perf_counter(); engine.step(); times.append(time.perf_counter() - t0)
print(sorted(times)[len(times) // 2] * 1e3, flush=True)
"""
THREAD_LAYOUTS = ((1, 1), (2, 1), (1, 2))   # (processes, torch threads each) on the 2 cores


def run_layout(dtype_name: str, batch: int, seconds: float, policy: str, processes: int, threads: int) -> list[float]:
    """Median decode step (ms) of each of `processes` engines stepping at the same time."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_NUM_THREADS": str(threads)}
    if policy == "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    argv = [sys.executable, "-c", THREAD_WORKER, dtype_name, str(batch), str(seconds), str(threads)]
    procs = [subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    for proc in procs:
        assert proc.stdout is not None   # stdout=PIPE
        assert proc.stdout.readline().strip() == "READY"
    for proc in procs:   # start together so the processes really share the cores
        assert proc.stdin is not None   # stdin=PIPE
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return [float(proc.communicate()[0].strip()) for proc in procs]


def thread_study(dtype_name: str, batch: int, seconds: float, rounds: int = 2) -> dict[str, list[float]]:
    """Each (wait policy, layout) `rounds` times, interleaved so machine noise hits all alike."""
    results: dict[str, list[float]] = {}
    for _ in range(rounds):
        for policy in ("default", "PASSIVE"):
            for processes, threads in THREAD_LAYOUTS:
                key = f"OMP_WAIT_POLICY={policy}, {processes} process(es) x {threads} thread(s)"
                results.setdefault(key, []).extend(run_layout(dtype_name, batch, seconds, policy, processes, threads))
    for key, step_ms in results.items():
        print(f"  {key:55s} decode b={batch} median step {sorted(step_ms)[len(step_ms) // 2]:6.1f} ms  "
              f"(all: {', '.join(f'{x:.0f}' for x in step_ms)})", flush=True)
    return results
