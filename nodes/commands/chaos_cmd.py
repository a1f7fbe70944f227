"""`pdbus chaos`: the chaos and failover harness (harness/chaos/, docs in its runner).

Contract: `add_arguments(parser)` and `main(args) -> int`. Starts its own local cluster on
loopback (broker, prefill and decode nodes, the gateway), streams a seeded greedy workload once
fault-free and once per scenario while the scenario's fault hits, prints one table row per
scenario and writes the run as JSON under `--results` (default results/). Exit 0 only when every
scenario passed, 1 otherwise, 2 for an unknown scenario. Every process it starts is stopped by
PID when it ends (also on Ctrl-C and SIGTERM). `--config` is not read: the harness writes its own. `--short` is the `make test` form (tiny, small workload).
"""

from __future__ import annotations

import argparse
import signal
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.chaos.scenarios import SCENARIOS

    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), metavar="NAME",
                        help=f"run only this scenario (repeatable); default: all in order: {', '.join(SCENARIOS)}")
    parser.add_argument("--model", default="tiny", help="tiny (default) or SmolLM2-135M-Instruct")
    parser.add_argument("--kv", choices=["raw", "int8"], default="raw",
                        help="KV mode on the wire: raw (lossless: streams must be identical) or int8")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="engine dtype: float32 (default; with raw KV streams must be identical) or "
                             "bfloat16 (the product's default engine: divergences are reported, not failed)")
    parser.add_argument("--driver", choices=["sse", "ws", "bus"], default="sse",
                        help="sse: OpenAI /v1/completions streaming (texts compared); ws: the gateway's "
                             "WebSocket (token ids compared); bus: ClusterClient, no gateway (token ids)")
    parser.add_argument("--requests", type=int, help="requests per pass (default 8; short 6)")
    parser.add_argument("--concurrency", type=int, help="streams at once (default 4; short 3)")
    parser.add_argument("--prompt-tokens", type=int, help="prompt length in tokens (default 64)")
    parser.add_argument("--max-tokens", type=int, help="tokens per stream (default 48)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short", action="store_true", help="the short form: kill-decode, kill-broker (two brokers), corrupt-kv, abort-storm, partition")
    parser.add_argument("--results", default="results", help="folder for the JSON (default: results/)")


def main(args: argparse.Namespace) -> int:
    from harness.chaos.chaos_runner import ChaosOptions, short_options
    from harness.chaos.chaos_runner import main as run

    values = {"model": args.model, "kv": args.kv, "dtype": args.dtype, "driver": args.driver, "seed": args.seed,
              "results_dir": args.results}
    for name, key in (("requests", "num_requests"), ("concurrency", "concurrency"),
                      ("prompt_tokens", "prompt_tokens"), ("max_tokens", "max_tokens")):
        if getattr(args, name) is not None:
            values[key] = getattr(args, name)
    if args.scenario:
        values["scenarios"] = args.scenario
    options = short_options(**values, verbose=True) if args.short else ChaosOptions(**values)
    # SIGTERM unwinds like Ctrl-C, so the cluster's `with` block stops every process it started.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(options)
    except ValueError as exc:
        print(f"pdbus chaos: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"pdbus chaos: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
