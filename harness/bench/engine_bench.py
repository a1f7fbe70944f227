"""`make bench-engine`: the built-in engine's prefill and decode speed beside its references.

For each dtype (default: float32 and bfloat16), with the same torch thread count everywhere:
- prefill tokens/s for 128/512/1024-token prompts: the engine, Hugging Face transformers (one
  forward with `logits_to_keep=1`, as `generate` does) and two GEMM rooflines: torch.matmul of the
  model's own weight shapes, every layer, same dtype (the linear layers only), and that plus the
  causal attention's two products at the GEMM rate torch.matmul reached on those weights (a
  prompt's attention grows with the square of its length, so the linear-only roofline leaves out
  a growing share of the work a prefill must do);
- decode tokens/s at batch 1, 8, 32 with 512 tokens of context (random KV: speed does not depend
  on its values): the engine, transformers (DynamicCache) and the GEMM roofline; the bandwidth
  floor of a batch-1 step = weight bytes / single-core read bandwidth measured now; and each
  batch's step floor (harness.bench.roofline.decode_step_floor: its multiply-adds at torch.matmul's
  best rate on a square product, or its bytes at that bandwidth, whichever is longer), which bounds
  the batch-32 / batch-1 ratio any engine could reach on this core.
Then the thread study: decode steps of one engine process alone (1 or 2 torch threads) and of two
processes (1 thread each) sharing the two cores, under OpenMP's default wait policy and under
OMP_WAIT_POLICY=PASSIVE, interleaved and repeated (harness/bench/engine_threads.py).
`--device cuda` runs the same tables on a GPU (the engine with and without CUDA graphs, transformers
and the rooflines on the device, its memory's read bandwidth; no thread study); `make bench-engine-cuda`.
Prints tables; `--json PATH` also writes the figures. Run under `flock /tmp/pdbus-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import TypedDict

import torch

from harness.bench.engine_threads import thread_study
from harness.bench.roofline import (
    best_time,
    decode_step_floor,
    gemm_seconds,
    peak_mac_rate,
    plain_weights,
    read_bandwidth,
    roofline_with_attention_seconds,
    synchronize,
)
from nodes.engines.base import DecodeRequest, EngineConfig, PrefillRequest, SamplingParams
from nodes.engines.engine_common import resolve_dtype
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import load_model, prepare_model

PREFILL_LENGTHS = (128, 512, 1024)
DECODE_BATCHES = (1, 8, 32)
CONTEXT = 512
GREEDY = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)


def random_prompt(num_tokens: int, seed: int, vocab_size: int = 40_000) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(min(100, vocab_size // 2), min(40_000, vocab_size), (num_tokens,), generator=g).tolist())


def prefill_request(engine: LlamaEngine, num_tokens: int) -> PrefillRequest:
    return PrefillRequest("p", random_prompt(num_tokens, num_tokens, engine.vocab_size), GREEDY)


def engine_prefill_seconds(engine: LlamaEngine, num_tokens: int) -> float:
    request = prefill_request(engine, num_tokens)
    return best_time(lambda: engine.prefill([request]), 3)


def engine_chunked_prefill_seconds(engine: LlamaEngine, num_tokens: int) -> float:
    """The same prompt as an interruptible pass in chunks of `[engine] prefill_chunk_tokens` (what a
    prefill node runs so a recovery prefill can cut in, and a colocated node between decode steps)."""
    request = prefill_request(engine, num_tokens)

    def run() -> None:
        prefill = engine.start_prefill([request], chunk_tokens=engine.config.prefill_chunk_tokens)
        while not prefill.done:
            prefill.step()
    return best_time(run, 3)


def engine_decode_seconds(engine: LlamaEngine, batch: int, num_steps: int) -> float:
    """Seconds per decode step with `batch` requests at CONTEXT tokens of imported (random) KV."""
    layout = engine.kv_layout
    for i in range(batch):
        kv = torch.randn(layout.shape(CONTEXT), dtype=layout.dtype)
        request = DecodeRequest(f"d{i}", random_prompt(CONTEXT, i), GREEDY, kv=kv, first_token_id=1000 + i)
        assert engine.add_request(request).ok
    engine.step()
    engine.step()
    t0 = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
    seconds = (time.perf_counter() - t0) / num_steps
    for i in range(batch):
        engine.abort(f"d{i}")
    return seconds


def hf_model(dtype: torch.dtype, device: str = "cpu"):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(prepare_model(), dtype=dtype)
    # transformers wraps `to` in functools.wraps, whose typeshed type does not bind `self` on a method
    return model.to(device).eval()  # type: ignore[arg-type]


@torch.inference_mode()
def hf_prefill_seconds(model, num_tokens: int, last_logits_only: bool) -> float:
    """`model(ids)` computes logits for every prompt token; `generate` asks for the last only."""
    ids = torch.tensor([random_prompt(num_tokens, num_tokens)], device=model.device)
    keep = 1 if last_logits_only else 0
    return best_time(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=keep), 3)


@torch.inference_mode()
def hf_decode_seconds(model, batch: int, num_steps: int) -> float:
    from transformers import DynamicCache
    c = model.config
    cache = DynamicCache(config=c)
    head_dim = c.hidden_size // c.num_attention_heads
    for layer in range(c.num_hidden_layers):
        shape = (batch, c.num_key_value_heads, CONTEXT, head_dim)
        cache.update(torch.randn(shape, dtype=model.dtype, device=model.device),
                     torch.randn(shape, dtype=model.dtype, device=model.device), layer)
    ids = torch.randint(100, 40_000, (batch, 1), device=model.device)
    times = []
    for step in range(num_steps + 2):
        synchronize()
        t0 = time.perf_counter()
        # `past_key_values`: an unknown keyword (`cache=`) is swallowed by **kwargs, and the step
        # then runs without its context (how the runs before 2026-12-01 01:20 UTC measured it).
        out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                    position_ids=torch.full((batch, 1), CONTEXT + step, device=model.device))
        ids = out.logits[:, -1].argmax(-1, keepdim=True)
        synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2]   # median step after warm-up


def bench_dtype(model, dtype_name: str, threads: int, num_steps: int, device: str = "cpu",
                cuda_graphs: bool = True) -> dict[str, object]:
    dtype = resolve_dtype(dtype_name, device)
    settings = EngineConfig(dtype=dtype_name, device=device, num_threads=threads, num_kv_blocks=8192,
                            max_batch_tokens=4096)
    engine = LlamaEngine(model, replace(settings, cuda_graphs=cuda_graphs))
    # On a GPU the same engine without CUDA graphs too: what the graphs buy, side by side.
    eager = LlamaEngine(model, replace(settings, cuda_graphs=False)) if engine.runner.graphs else None
    weights = plain_weights(model, dtype, device)
    bandwidth = read_bandwidth(weights)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)   # what one decode step reads
    floor_s = weight_bytes / (max(bandwidth.values()) * 1e9)
    hf = hf_model(dtype, device)
    prefill: dict[int, dict[str, float]] = {}
    decode: dict[int, dict[str, float]] = {}
    result: dict[str, object] = {"dtype": dtype_name, "device": device, "threads": threads,
                                 "weight_bytes": weight_bytes, **bandwidth, "floor_step_ms": floor_s * 1e3,
                                 "prefill": prefill, "decode": decode}
    for n in PREFILL_LENGTHS:
        ours, theirs = engine_prefill_seconds(engine, n), hf_prefill_seconds(hf, n, last_logits_only=True)
        chunked = engine_chunked_prefill_seconds(engine, n)
        theirs_all = hf_prefill_seconds(hf, n, last_logits_only=False)
        gemm = gemm_seconds(weights, n, 1)
        with_attention = roofline_with_attention_seconds(model.config, weights, n, gemm)
        prefill[n] = {"engine_tok_s": n / ours, "hf_tok_s": n / theirs, "hf_all_logits_tok_s": n / theirs_all,
                      "gemm_tok_s": n / gemm, "gemm_attention_tok_s": n / with_attention,
                      "engine_chunked_tok_s": n / chunked}
        print(f"  prefill {n:5d}: engine {n / ours:8.0f} tok/s (chunks of {engine.config.prefill_chunk_tokens}: "
              f"{n / chunked:6.0f})  hf {n / theirs:8.0f} (all logits {n / theirs_all:6.0f})  gemm {n / gemm:8.0f} "
              f"(with attention {n / with_attention:6.0f})",
              flush=True)
    # A 1024^3 product is a CPU core's best case; a GPU needs a larger one to reach its peak.
    peak_size = result["peak_size"] = 1024 if device == "cpu" else 8192
    peak = peak_mac_rate(dtype, peak_size, device)
    result["peak_gmacs"] = peak / 1e9
    for b in DECODE_BATCHES:
        ours = engine_decode_seconds(engine, b, num_steps)
        theirs = hf_decode_seconds(hf, b, max(3, num_steps // 4))
        gemm = gemm_seconds(weights, b, b)
        floor = decode_step_floor(model.config, weights, b, CONTEXT, peak, max(bandwidth.values()))
        decode[b] = {"engine_tok_s": b / ours, "hf_tok_s": b / theirs, "gemm_tok_s": b / gemm,
                     "engine_step_ms": ours * 1e3, "hf_step_ms": theirs * 1e3,
                     "floor_step_ms": floor["seconds"] * 1e3, "floor_gmacs": floor["macs"] / 1e9,
                     "floor_mb": floor["bytes"] / 1e6}
        eager_note = ""
        if eager is not None:
            eager_s = engine_decode_seconds(eager, b, num_steps)
            decode[b] |= {"eager_tok_s": b / eager_s, "eager_step_ms": eager_s * 1e3}
            eager_note = f"  without CUDA graphs {b / eager_s:8.1f} ({eager_s * 1e3:6.2f} ms)"
        print(f"  decode  b={b:3d}: engine {b / ours:8.1f} tok/s ({ours * 1e3:6.2f} ms/step)  "
              f"hf {b / theirs:7.1f} ({theirs * 1e3:6.2f} ms)  gemm {b / gemm:8.1f}{eager_note}", flush=True)
    return result


def print_summary(result: dict) -> None:
    p, d = result["prefill"], result["decode"]
    where = result.get("device", "cpu")
    print(f"\n## {result['dtype']} on {where}, {result['threads']} thread(s); weights {result['weight_bytes'] / 2**20:.0f} MiB; "
          f"read bandwidth {result['dram_gbs']:.1f} GB/s (1 GiB buffer), {result['weights_pass_gbs']:.1f} GB/s "
          f"(pass over the weights); batch-1 floor {result['floor_step_ms']:.1f} ms/step")
    print("| prefill tokens | engine tok/s | hf last-token logits tok/s | engine/hf | hf all logits tok/s | "
          "engine/hf all | GEMM roofline tok/s (linear layers) | engine/roofline | roofline + attention FLOPs tok/s | "
          "engine/roofline + attention | chunked tok/s | chunked/whole |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in p.items():
        with_attention = r.get("gemm_attention_tok_s", float("nan"))
        print(f"| {n} | {r['engine_tok_s']:.0f} | {r['hf_tok_s']:.0f} | {r['engine_tok_s'] / r['hf_tok_s']:.2f}x | "
              f"{r['hf_all_logits_tok_s']:.0f} | {r['engine_tok_s'] / r['hf_all_logits_tok_s']:.2f}x | "
              f"{r['gemm_tok_s']:.0f} | {r['engine_tok_s'] / r['gemm_tok_s']:.0%} | "
              f"{with_attention:.0f} | {r['engine_tok_s'] / with_attention:.0%} | "
              f"{r['engine_chunked_tok_s']:.0f} | {r['engine_chunked_tok_s'] / r['engine_tok_s']:.2f}x |")
    graphs = all("eager_tok_s" in r for r in d.values())
    print("| decode batch (ctx 512) | engine tok/s | transformers tok/s | engine/hf | GEMM roofline tok/s | vs batch 1 |"
          + (" without CUDA graphs tok/s | graphs/eager |" if graphs else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if graphs else ""))
    for b, r in d.items():
        print(f"| {b} | {r['engine_tok_s']:.1f} ({r['engine_step_ms']:.2f} ms/step) | {r['hf_tok_s']:.1f} | "
              f"{r['engine_tok_s'] / r['hf_tok_s']:.2f}x | {r['gemm_tok_s']:.0f} | "
              f"{r['engine_tok_s'] / d[1]['engine_tok_s']:.1f}x |"
              + (f" {r['eager_tok_s']:.1f} ({r['eager_step_ms']:.2f} ms/step) | "
                 f"{r['engine_tok_s'] / r['eager_tok_s']:.2f}x |" if graphs else ""))
    print(f"batch-1 step: {d[1]['engine_step_ms']:.2f} ms = {d[1]['engine_step_ms'] / result['floor_step_ms']:.2f}x "
          f"the bandwidth floor ({result['floor_step_ms']:.3f} ms)")
    if "peak_gmacs" in result:
        print(f"step floors (multiply-adds at torch.matmul's best rate here, {result['peak_gmacs']:.0f} G/s on a "
              f"{result.get('peak_size', 1024)}^3 product, or bytes at {max(result['dram_gbs'], result['weights_pass_gbs']):.1f} GB/s, "
              "whichever is longer):")
        for b, r in d.items():
            floor_tok_s = b / (r["floor_step_ms"] / 1e3)
            print(f"  batch {b:2d}: {r['floor_step_ms']:.1f} ms ({r['floor_gmacs']:.2f} G multiply-adds, "
                  f"{r['floor_mb']:.0f} MB) = at most {floor_tok_s:.0f} tok/s, "
                  f"{floor_tok_s / d[1]['engine_tok_s']:.1f}x the engine's batch 1; the engine reaches "
                  f"{r['floor_step_ms'] / r['engine_step_ms']:.0%} of it")


class Results(TypedDict):
    """What `--json` writes: `bench_dtype`'s result per dtype, and `thread_study`'s."""
    speed: list[dict[str, object]]
    threads: dict[str, list[float]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.engine_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N (the thread study runs on cpu only)")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="on a GPU, the engine without CUDA graphs only")
    parser.add_argument("--steps", type=int, default=12, help="timed decode steps per batch size")
    parser.add_argument("--skip-threads", action="store_true", help="skip the OMP wait-policy study")
    parser.add_argument("--only-threads", action="store_true", help="run only the OMP wait-policy study")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = None if args.only_threads else load_model(dtype=torch.float32)
    if args.device != "cpu":
        print(f"device {args.device}: {torch.cuda.get_device_name(torch.device(args.device))}")
    print(f"torch {torch.__version__}, {args.threads} thread(s), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'default')}")
    results: Results = {"speed": [], "threads": {}}
    for dtype_name in [] if args.only_threads else args.dtypes.split(","):
        print(f"[{dtype_name}]", flush=True)
        results["speed"].append(bench_dtype(model, dtype_name, args.threads, args.steps, args.device,
                                            cuda_graphs=not args.no_cuda_graphs))
    for result in results["speed"]:
        print_summary(result)
    if not args.skip_threads and args.device == "cpu":
        print("\n[threads] two engine processes on this machine's cores", flush=True)
        results["threads"] = thread_study(args.dtypes.split(",")[-1], 8, 6.0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
