"""`make bench-kv-device`: the KV path from a prefill engine's device to a decode process's device.

Run `python -m harness.bench.kv_device_bench --device cuda [--model random-llama-8b]
[--tokens 1024,4096,16384] [--json PATH]` (on a CPU, `--device cpu` runs the same code at a small
shape: its test). In one run, with a decode-side process (harness/bench/kv_decode_side.py) whose
destinations live on the same device and are decoded there (nodes/engines/kv_landing.py):
- the physical limits: device memcpy, pinned device-to-host and host-to-device copies, and a bare
  loopback socket (one multipart pyzmq send of 1 MiB frames);
- per prompt length and wire mode, TTFT (the prefill pass until its first token, its KV encoded
  on the device as layers finish, nodes/engines/kv_export.py) and the transfer's tail after it (the
  real KVSender to that process, started as the export begins, as a prefill node starts it, with
  checksums and acknowledgements, until the destination has landed on its device), the tail's
  share of TTFT; `cpu-int8` is the path before this issue: the pass, a copy of the whole KV to
  pinned memory, then the CPU's int8 codec, sent after the pass; and the path alone (the same KV
  sent again from the host until it has landed) against its slowest stage at the physical limits;
- per stage, time and GB/s of the bytes it moves: device quantize, D2H, socket, H2D, dequantize;
- the targets: int8 transfer of a 4K prompt <= 5 % of TTFT, device int8 codec >= 100 GB/s, the
  KV path within 2x of its slowest stage at the physical limits measured here.
Figures are best of `--repeats` (noise only ever adds time). The model is random-weight (named so
in every line): its KV sizes are an 8B Llama's, its tokens mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import zmq
import zmq.asyncio

from bus.kv import KVSender
from harness.bench.kv_baselines import SEND_CONFIG, bare_send_seconds
from harness.bench.kv_device_stages import measure_limits, measure_stages
from nodes.engines.base import EngineConfig, PrefillRequest, SamplingParams
from nodes.engines.kv_quant import TorchQuantizer
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import load_model
from nodes.loop_thread import LoopThread

MODES = ("cpu-int8", "raw", "bf16", "int8")   # cpu-int8: the KV copied out after the pass, the CPU codec


class Peer:
    """The decode side as its own process; `landed()` waits for its line about one transfer."""

    def __init__(self, device: str) -> None:
        # --no-warmup: the bench's own warm-up round compiles what a transfer uses, and no more
        self.process = subprocess.Popen([sys.executable, "-m", "harness.bench.kv_decode_side", "--torch", "--no-warmup",
                                         "--device", device], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.endpoints = json.loads(self.process.stdout.readline())
        self.lines: list[dict] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._ready:
                self.lines.append(json.loads(line))
                self._ready.notify_all()

    def landed(self, transfer_id: str, timeout: float = 120.0) -> dict:
        def line() -> dict | None:
            return next((x for x in self.lines if x["transfer_id"] == transfer_id), None)

        with self._ready:
            if not self._ready.wait_for(line, timeout):
                raise RuntimeError(f"the peer reported no transfer {transfer_id} within {timeout:.0f} s")
            return line()  # type: ignore[return-value]

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def one_request(engine: LlamaEngine, sender: KVSender, kv_thread: LoopThread, peer: Peer,
                prompt: tuple[int, ...], mode: str, name: str) -> dict:
    """TTFT, then the KV until the peer's destination has landed, as a prefill node runs them: with
    the device codec the send starts when the export does (Engine.on_kv_export), inside the pass."""
    engine.config = replace(engine.config, kv_export="" if mode == "cpu-int8" else mode)
    wire_mode = "int8" if mode == "cpu-int8" else mode
    sends: list[concurrent.futures.Future] = []

    def send(transfer_id: str, kv: Any) -> None:
        sends.append(kv_thread.submit(sender.send(peer.endpoints["kv"], transfer_id, transfer_id, kv,
                                                  mode=wire_mode, compression="none")))

    def until_landed(transfer_id: str) -> Any:
        report, line = sends.pop().result(timeout=300), peer.landed(transfer_id)
        if not (report.ok and line["ok"]):
            raise RuntimeError(f"transfer {transfer_id} failed: {report} / {line}")
        return report

    engine.on_kv_export = lambda request_id, export: send(name, export)
    started = time.perf_counter()
    result = engine.prefill([PrefillRequest(name, prompt, SamplingParams(temperature=0.0, max_tokens=1))])[0]
    ttft = time.perf_counter() - started
    if not sends:   # the CPU codec's path: the KV leaves after the pass
        send(name, result.kv)
    report = until_landed(name)
    landed = time.perf_counter() - started
    # The path alone: the same KV sent again, every layer on the host already, until it has landed.
    send(f"{name}-again", result.kv)
    until_landed(f"{name}-again")
    return {"ttft_s": ttft, "transfer_s": landed - ttft, "send_s": report.stats.seconds,
            "path_s": time.perf_counter() - started - landed, "wire_bytes": report.stats.wire_bytes,
            "raw_bytes": report.stats.raw_bytes}


def run_requests(engine: LlamaEngine, peer: Peer, tokens: list[int], repeats: int, vocab: int,
                 modes: tuple[str, ...] = MODES, done: Callable[[dict], None] = lambda rows: None) -> dict:
    """Per prompt length, each mode's best row of `repeats` rounds after a warm-up; `done(rows)`
    after each length, so a run cut short keeps what it measured."""
    kv_thread = LoopThread("kv")
    sender = KVSender(quantizer=TorchQuantizer(), config=SEND_CONFIG)
    generator = torch.Generator().manual_seed(0)
    rows: dict[str, dict] = {}
    for num_tokens in tokens:
        prompt = tuple(torch.randint(3, vocab, (num_tokens,), generator=generator).tolist())
        for round_ in range(repeats + 1):   # round 0 warms up kernels, pools and sockets
            for mode in modes:
                row = one_request(engine, sender, kv_thread, peer, prompt, mode, f"{num_tokens}-{mode}-{round_}")
                if round_:
                    best = rows.setdefault(f"{num_tokens} {mode}", row)
                    for key in ("ttft_s", "transfer_s", "send_s", "path_s"):
                        best[key] = min(best[key], row[key])
        done(rows)
    kv_thread.run(sender.close())
    kv_thread.stop()
    return rows


async def socket_seconds(peer: Peer, num_bytes: int) -> float:
    """A bare pyzmq send of `num_bytes` in 1 MiB frames to the peer, and its answer (best of 3)."""
    context = zmq.asyncio.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.connect(peer.endpoints["bare"])
    frame = b"\x01" * (1 << 20)
    frames = [frame] * max(1, num_bytes >> 20)
    times = [await bare_send_seconds(socket, frames) for _ in range(4)][1:]
    socket.close(linger=0)
    return min(times) * num_bytes / (len(frames) << 20)


def summary(rows: dict, limits: dict) -> dict:
    """Per row: the transfer's tail as a share of TTFT, and the path alone (host to landed: socket,
    checksums, H2D, decode) over its slowest stage at this run's physical limits."""
    for row in rows.values():
        wire = row["wire_bytes"]
        floor = max(wire / limits["socket_GBps"], wire / limits["h2d_GBps"]) / 1e9
        row["share_of_ttft"] = row["transfer_s"] / row["ttft_s"]
        row["floor_s"] = floor
        row["path_over_floor"] = row["path_s"] / floor
    return rows


def print_report(env: dict, limits: dict, stages: dict, rows: dict) -> None:
    if not rows:
        print("(no request finished: the figures below are the limits and stages only)")
    print(f"\n## KV path on {env['device_name']} ({env['model']}, {env['source']}, {env['dtype']}; torch {env['torch']})\n")
    print("Physical limits (this run): " + ", ".join(f"{k.removesuffix('_GBps')} {v:.1f} GB/s" for k, v in limits.items()))
    print("\n| prompt | stage | ms | GB/s |\n|---|---|---|---|")
    for key, (seconds, num_bytes) in sorted(stages.items(), key=lambda item: int(item[0].split()[0])):
        print(f"| {key.split()[0]} | {' '.join(key.split()[1:])} | {seconds * 1e3:.2f} | {num_bytes / seconds / 1e9:.1f} |")
    print("\n| prompt | mode | TTFT ms | transfer after TTFT ms | whole send ms | share of TTFT | wire MiB | "
          "path alone ms | path / floor |\n|---|---|---|---|---|---|---|---|---|")
    for key, row in rows.items():
        tokens, mode = key.split()
        print(f"| {tokens} | {mode} | {row['ttft_s'] * 1e3:.1f} | {row['transfer_s'] * 1e3:.1f} | {row['send_s'] * 1e3:.1f} | "
              f"{row['share_of_ttft'] * 100:.1f} % | {row['wire_bytes'] / 2**20:.0f} | {row['path_s'] * 1e3:.1f} | "
              f"{row['path_over_floor']:.2f}x |")
    print()
    for line in targets(stages, rows):
        print(line)


def targets(stages: dict, rows: dict) -> list[str]:
    """The issue's three targets, each from figures of this run."""
    if not stages:
        return ["- no stage was measured"]
    largest = max(int(key.split()[0]) for key in stages if key.endswith("dequantize"))
    codec = {stage: stages[f"{largest} {stage}"][1] / stages[f"{largest} {stage}"][0] / 1e9
             for stage in ("device quantize", "dequantize")}
    lines = [f"- device int8 codec at {largest} tokens: quantize {codec['device quantize']:.1f} GB/s, "
             f"dequantize {codec['dequantize']:.1f} GB/s (target >= 100: "
             f"{'met' if min(codec.values()) >= 100 else 'missed'})"]
    for key, row in rows.items():
        tokens, mode = key.split()
        if mode == "int8" and "share_of_ttft" in row:
            lines.append(f"- int8 at {tokens} tokens: transfer {row['share_of_ttft'] * 100:.1f} % of TTFT "
                         f"(target <= 5 % at 4096: {'met' if row['share_of_ttft'] <= 0.05 else 'missed'}); "
                         f"path {row['path_over_floor']:.2f}x its slowest stage at the physical limits "
                         f"(target <= 2x: {'met' if row['path_over_floor'] <= 2 else 'missed'})")
    return lines


def save(path: str | None, figures: dict) -> None:
    """The figures so far (`complete` false until the run ends): a run cut short by the device call's
    limit still brings back what it measured, and `--report PATH` prints it."""
    if path:
        with open(path + ".part", "w") as out:
            json.dump(figures, out, indent=1)
        os.replace(path + ".part", path)


def report_from(path: str) -> int:
    with open(path) as saved:
        figures = json.load(saved)
    stages = {key: (value["seconds"], value["bytes"]) for key, value in figures.get("stages", {}).items()}
    print_report(figures["env"], figures.get("limits", {}), stages, figures.get("rows", {}))
    if not figures.get("complete"):
        print("\n(a partial run: it ended before every prompt length was measured)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="random-llama-8b")
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", help="the engine's (default: bfloat16 on a GPU, float32 on a CPU)")
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    parser.add_argument("--json", help="write the figures here, after each step")
    parser.add_argument("--report", metavar="JSON", help="print the report of a saved run (partial or whole) and stop")
    args = parser.parse_args()
    if args.report:
        return report_from(args.report)
    tokens = [int(t) for t in args.tokens.split(",")]
    modes = tuple(args.modes.split(","))
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: each of {', '.join(MODES)}")
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    model = load_model(args.model, device=args.device, dtype=getattr(torch, dtype))
    engine = LlamaEngine(model, EngineConfig(device=args.device, dtype=dtype,
                                             prefix_cache_bytes=0, max_batch_tokens=max(tokens),
                                             max_model_len=max(tokens) + 16, num_kv_blocks=16, max_num_seqs=1,
                                             preallocate_kv=False, cuda_graphs=False))
    env = {"device": args.device, "model": args.model, "source": model.source, "dtype": dtype, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"}
    del model   # the engine holds its own copy of the weights
    figures: dict[str, Any] = {"env": env, "complete": False}
    peer = Peer(args.device)
    try:
        limits = figures["limits"] = measure_limits(args.device)
        limits["socket_GBps"] = (256 << 20) / asyncio.run(socket_seconds(peer, 256 << 20)) / 1e9
        save(args.json, figures)
        stages = measure_stages(engine, tokens, args.device)
        for tokens_ in tokens:   # the socket stage: int8's wire bytes of this prompt, bare
            wire = stages[f"{tokens_} D2H"][1]
            stages[f"{tokens_} socket"] = (asyncio.run(socket_seconds(peer, wire)), wire)
        figures["stages"] = {k: {"seconds": s, "bytes": b} for k, (s, b) in stages.items()}
        save(args.json, figures)

        def done(rows: dict) -> None:
            figures["rows"] = summary(rows, limits)
            save(args.json, figures)

        rows = run_requests(engine, peer, tokens, args.repeats, engine.vocab_size, modes, done)   # summarized by done
    finally:
        peer.close()
    figures["complete"] = True
    save(args.json, figures)
    print_report(env, limits, stages, rows)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PDBUS_LOG_LEVEL", "warning")
    sys.exit(main())
