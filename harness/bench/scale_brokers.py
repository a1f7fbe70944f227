"""`make bench-scale`, the brokers curve: the same token load through 1, 2, 3, 4 brokers of one
cluster (docs/PROTOCOL.md §1.12: every load-generator node and the client register with each; the
client sends its requests through them in turn).

Contract: `python -m harness.bench.scale_brokers [--brokers 1,2,3,4] [--nodes 16]
[--streams-per-node 64] [--steps 0.037,0.01] [--seconds 5]`: for each step (a fixed offered rate,
then one past one broker's saturation on this machine) and each broker count, one fresh point of
`harness.bench.scale_point` on the batched path; prints tokens/s, latency p50/p99, the brokers'
CPU (summed) per token and per broker, and writes results/scale-brokers-<date>.json. On two cores
the brokers share the cores with the load generators and the client, so this measures what more
brokers cost here, not what they add on more machines (docs/BENCHMARKS.md states the projection).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness.bench.scale_point import Point, run_point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="1,2,3,4")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--streams-per-node", type=int, default=64)
    parser.add_argument("--steps", default="0.037,0.01", help="node step times (s): offered rates")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out-dir", default="results")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'step s':>7} {'brokers':>7} {'offered/s':>10} {'tokens/s':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'broker us/tok':>13} {'CPU/broker':>10}")
    for step in (float(s) for s in args.steps.split(",")):
        for brokers in (int(b) for b in args.brokers.split(",")):
            point = Point("batched", args.nodes, args.streams_per_node, step, seconds=args.seconds)
            row = run_point(point, brokers=brokers) | {"brokers": brokers}
            rows.append(row)
            print(f"{step:7.3f} {brokers:7d} {row['nominal_per_s']:10.0f} {row['tokens_per_s']:10.0f} "
                  f"{row['p50_ms']:7.2f} {row['p99_ms']:7.2f} {row['broker_us_per_token']:13.2f} "
                  f"{row['broker_cpu_frac'] / brokers:10.3f}", flush=True)
    out = Path(args.out_dir) / f"scale-brokers-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
