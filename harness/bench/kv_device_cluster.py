"""A prefill node and a decode node as two processes on one device: TTFT and the KV transfer as a
client sees them (part of the GPU check, harness/device/cuda_checks.sh "kv").

Run `python -m harness.bench.kv_device_cluster --device cuda [--model random-llama-8b]
[--tokens 1024,4096,16384] [--modes raw,bf16,int8] [--json PATH]`. Per mode, one cluster (broker,
nodes and client on loopback; `[kv] device_codec` "auto", so on a GPU the prefill node's KV is
encoded on the device as layers finish and the decode node decodes chunks there), then per prompt
length two greedy requests of 4 tokens, the first a warm-up: the client's time to the first token
(the prefill node's), to the second (the KV has landed on the decode node and one step ran), and
the transfer as the prefill node reported it (seconds, wire bytes). On a CPU (`--device cpu --model
tiny`) the same runs at a small size: its test. The model is random-weight and named so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from harness.bench.kv_device_bench import save
from harness.cluster_procs import ClusterProcs
from nodes.cluster import ClusterClient
from nodes.engines.base import SamplingParams

MAX_TOKENS = 4


async def one_request(client: ClusterClient, prompt: list[int]) -> dict:
    started = time.perf_counter()
    arrivals = []
    generation = client.generate(prompt, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    async for _ in generation:
        arrivals.append(time.perf_counter() - started)
    result = generation.result
    assert result is not None and len(arrivals) == MAX_TOKENS, f"the stream ended early: {arrivals}"
    transfer = result.trace.kv_transfers[-1] if result.trace.kv_transfers else {}
    return {"ttft_s": arrivals[0], "second_token_s": arrivals[1], "plan": result.trace.plans[-1],
            "transfer_s": transfer.get("seconds"), "wire_bytes": result.trace.kv_wire_bytes,
            "kv_mode": result.trace.kv_mode}


def run_mode(mode: str, args: argparse.Namespace, tokens: list[int]) -> dict:
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    longest = max(tokens)
    settings = {"engine": {"device": args.device, "dtype": dtype, "max_model_len": longest + 64,
                           "prefill_chunk_tokens": longest},   # one pass a prompt, as kv_device_bench runs it
                "prefill": {"max_batch_tokens": longest, "prefix_cache_mib": 0},
                "decode": {"num_kv_blocks": (2 * longest) // 16 + 64, "max_num_seqs": 4},
                "kv": {"compression": "none", "timeout_s": 120.0},
                "scheduler": {"local_suffix_tokens": 0}}
    rows = {}
    with ClusterProcs(num_prefill=1, num_decode=1, model=args.model, kv_quant=mode, settings=settings) as procs:
        client = ClusterClient(procs.broker_endpoint, max_retries=0, stall_timeout_s=300.0)
        with client:
            for num_tokens in tokens:
                prompt = [3 + (i * 7919) % 500 for i in range(num_tokens)]
                for attempt in range(2):
                    row = asyncio.run(one_request(client, [attempt, *prompt[1:]]))
                rows[f"{num_tokens} {mode}"] = row
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="random-llama-8b")
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--modes", default="raw,bf16,int8")
    parser.add_argument("--json", help="write the figures here, after each mode")
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    rows: dict[str, dict] = {}
    for mode in args.modes.split(","):
        rows |= run_mode(mode, args, tokens)
        save(args.json, {"device": args.device, "model": args.model, "source": "random-weight", "rows": rows})
    print(f"\n## Two nodes on {args.device}: {args.model} (random-weight), greedy, {MAX_TOKENS} tokens\n")
    print("| prompt | mode | plan | TTFT ms | 2nd token ms | transfer ms | wire MiB |\n|---|---|---|---|---|---|---|")
    for key, row in rows.items():
        transfer = "" if row["transfer_s"] is None else f"{row['transfer_s'] * 1e3:.1f}"
        print(f"| {key.split()[0]} | {row['kv_mode']} | {row['plan']} | {row['ttft_s'] * 1e3:.1f} | "
              f"{row['second_token_s'] * 1e3:.1f} | {transfer} | {row['wire_bytes'] / 2**20:.1f} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PDBUS_LOG_LEVEL", "warning")
    sys.exit(main())
