"""`make bench-scale`, the k brokers and k gateways curves: the same token load through 1, 2, 3, 4
brokers of one cluster (docs/PROTOCOL.md §1.12: every load-generator node and the client register
with each; the client sends its requests through them in turn), and the same HTTP/SSE load through
1, 2, 3, 4 gateway processes on one port (`pdbus gateway --workers k`, each its own bus client).

Contract: `python -m harness.bench.scale_brokers [--brokers 1,2,3,4] [--nodes 16]
[--streams-per-node 64] [--steps 0.037,0.01] [--gateways 1,2,3,4] [--http-steps 0.01,0.004]
[--http-clients 2] [--seconds 5] [--skip brokers|gateways]`: for each step (a fixed offered rate,
then one past one broker's, or one gateway's, saturation on this machine) and each count, one
fresh point of `harness.bench.scale_point` on the batched path (the gateways' over HTTP: 4 nodes
x 16 streams, `--http-clients` load processes); prints tokens/s, latency p50/p99, the tier's CPU
(summed over its processes) per token and per process, and writes
results/scale-brokers-<date>.json and results/scale-gateways-<date>.json. On two cores the brokers
and gateways share the cores with the load generators and the clients, so this measures what more
processes cost here, not what they add on more machines (docs/BENCHMARKS.md states the projection).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness.bench.scale_point import Point, run_point

HTTP_NODES, HTTP_STREAMS_PER_NODE = 4, 16


def _numbers(text: str, kind: type = float) -> list:
    """`"1,2,4"` as numbers of `kind`."""
    return [kind(part) for part in text.split(",") if part.strip()]


def curve(tier: str, counts: list[int], steps: list[float], make_point, run) -> list[dict]:
    """One fresh point per (step, count); `run(point, count) -> row`; prints a line each."""
    rows = []
    print(f"\n{tier}: {'step s':>7} {tier:>8} {'offered/s':>10} {'tokens/s':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{tier[:-1] + ' us/tok':>15} {'CPU each':>9}")
    role = tier[:-1]   # brokers -> broker, gateways -> gateway
    for step in steps:
        for count in counts:
            point = make_point(step)
            row = run(point, count) | {tier: count}
            rows.append(row)
            us = row.get(f"{role}_us_per_token")
            print(f"{tier}: {step:7.4f} {count:8d} {row['nominal_per_s']:10.0f} {row['tokens_per_s']:10.0f} "
                  f"{row['p50_ms']:7.2f} {row['p99_ms']:7.2f} {us if us is None else round(us, 2)!s:>15} "
                  f"{row.get(f'{role}_cpu_frac', 0.0) / count:9.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="1,2,3,4")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--streams-per-node", type=int, default=64)
    parser.add_argument("--steps", default="0.037,0.01", help="node step times (s) of the brokers curve")
    parser.add_argument("--gateways", default="1,2,3,4")
    parser.add_argument("--http-steps", default="0.01,0.004", help="node step times (s) of the gateways curve")
    parser.add_argument("--http-clients", type=int, default=2, help="HTTP load processes")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--skip", default="", help="brokers or gateways: a curve to leave out")
    parser.add_argument("--out-dir", default="results")
    args = parser.parse_args(argv)
    skip = {part.strip() for part in args.skip.split(",")}
    written = []
    if "brokers" not in skip:
        rows = curve("brokers", _numbers(args.brokers, int), _numbers(args.steps),
                     lambda step: Point("batched", args.nodes, args.streams_per_node, step, seconds=args.seconds),
                     lambda point, count: run_point(point, brokers=count))
        written.append(_write(args, "brokers", rows))
    if "gateways" not in skip:
        rows = curve("gateways", _numbers(args.gateways, int), _numbers(args.http_steps),
                     lambda step: Point("batched", HTTP_NODES, HTTP_STREAMS_PER_NODE, step, transport="http",
                                        seconds=args.seconds, client_processes=args.http_clients),
                     lambda point, count: run_point(point, gateways=count))
        written.append(_write(args, "gateways", rows))
    for path in written:
        print(f"written: {path}")
    return 0


def _write(args: argparse.Namespace, tier: str, rows: list[dict]) -> Path:
    out = Path(args.out_dir) / f"scale-{tier}-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
