"""`pdbus complete`: stream one completion through the cluster (the bus-level `ClusterClient`).

Contract: `add_arguments(parser)` and `main(args) -> int`. The prompt (wrapped in the model's chat
template with `--chat`) is tokenized with the cluster's model tokenizer (`[engine] model` or
`--model`), sent through the broker at `[broker] endpoint` (or `--broker`), and the text is written
to stdout as tokens arrive. One summary line goes to stderr: tokens, time to first token, decode
tokens/s, finish reason, the nodes that served it and any failover. Exit 1 with one line on stderr
when the cluster fails the request (or no broker answers), 2 for bad settings or model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from nodes.config_file import load_settings, section
from nodes.node_settings import DEFAULT_MODEL


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn of the chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--session", help="session id: stays on one decode node; a prompt that extends the "
                        "session's earlier prompt and answer reuses its cached KV")
    parser.add_argument("--broker", help="broker endpoint (default: [broker] endpoint)")
    parser.add_argument("--model", help="the cluster's model, for its tokenizer (default: [engine] model)")
    parser.add_argument("--model-dir", help="model cache directory")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the broker")


def _tokenizer(args: argparse.Namespace, settings: dict):
    from nodes.engines.model_loader import load_model

    engine = section(settings, "engine")
    model = load_model(args.model or engine.get("model", DEFAULT_MODEL), model_dir=args.model_dir or engine.get("model_dir"))
    return model.tokenizer


async def _stream(client, prompt, sampling, session_id) -> tuple:
    generation = client.generate(prompt, sampling, session_id=session_id)
    start, first_at = time.perf_counter(), None
    async for token in generation:
        first_at = first_at or time.perf_counter()
        sys.stdout.write(token.text)
        sys.stdout.flush()
    return generation.result, start, first_at, time.perf_counter()


def main(args: argparse.Namespace) -> int:
    from bus import constants as c
    from bus.liveness import HeartbeatConfig
    from nodes.cluster import ClusterClient, ClusterError
    from nodes.engines.base import SamplingParams
    from nodes.engines.model_loader import ModelLoadError

    settings = load_settings(args.config)
    broker = args.broker or section(settings, "broker").get("endpoint", c.DEFAULT_ENDPOINT)
    retries = int(section(settings, "failover").get("max_retries", 3))
    try:
        tokenizer = _tokenizer(args, settings)
        sampling = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    except (ModelLoadError, ValueError) as exc:
        print(f"pdbus complete: {exc}", file=sys.stderr)
        return 2
    text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    from nodes.bus_config import security_config  # CURVE as the gateway key when [security] wants it
    client = ClusterClient(broker, tokenizer=tokenizer, max_retries=retries,
                           heartbeat=HeartbeatConfig.from_settings(section(settings, "heartbeat")),
                           security=security_config(settings, "gateway", broker))
    try:
        client.start(args.timeout)
    except TimeoutError as exc:
        print(f"pdbus complete: {exc}", file=sys.stderr)
        return 1
    try:
        result, start, first_at, end = asyncio.run(_stream(client, tokenizer.encode(text), sampling, args.session))
    except ClusterError as exc:
        print(f"\npdbus complete: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print()
    n = len(result.token_ids)
    rate = (n - 1) / (end - first_at) if first_at and n > 1 and end > first_at else 0.0
    trace = result.trace
    print(f"[{result.usage['prompt_tokens']} prompt tokens, {n} generated, TTFT "
          f"{((first_at or end) - start) * 1e3:.0f} ms, {rate:.1f} tok/s, finish: {result.finish_reason}; "
          f"decode {','.join(trace.decode_node_ids)}, prefill {','.join(trace.prefill_node_ids) or '-'}, "
          f"plans {','.join(trace.plans)}, failovers {trace.num_failovers}]", file=sys.stderr)
    return 0
