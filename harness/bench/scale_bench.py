"""`make bench-scale`, the token plane: how many tokens per second one broker relays from many
decode nodes to many streams, at what latency and broker CPU per token — the batched path
(`Endpoint.reply_batch`: one STREAMS message per engine step and client) beside the per-token
path (one PARTIAL per token), in the same run.

Nodes are harness/loadgen processes (no engine: a node steps every `step_s` and sends one token
per running stream); the load is a `BusClient` process holding thousands of concurrent streams,
and once the real `pdbus gateway` with an HTTP/SSE client. Every point starts fresh processes
(harness/bench/scale_point.py) and measures a steady window: tokens/s relayed, latency from the
node's send to the client's hand (p50/p99/p99.9), and CPU per token of each process from /proc.
Sections, per path:
- ceiling: the broker alone, fed by bare pyzmq peers cheaper than it (harness/bench/scale_ceiling.py),
           64 streams, one stream started and ended per `--max-tokens` tokens (and, not quick,
           none): its own tokens/s and CPU per token with no load process competing for it;
- rate:    16 nodes x 64 streams, the step shortened until tokens/s stops following the offered
           rate (relayed < 90 % of it) or p99 passes 100 ms: the saturation rate (the most relayed);
- half:    the same at half the saturation rate, three times (the summary takes the median p99):
           the latency target (p99 <= 5 ms);
- nodes:   `--nodes` x `--streams-per-node`, each node stepping every `--step-s` — but never
           offering more than `--nodes-rate` (6,400 tokens/s) in all (the step is stretched),
           both paths at that one rate: what more nodes (peers, routes) cost the broker, apart
           from what more tokens cost. (256 nodes at 20 ms steps offer 819,200 tokens/s, 15x
           what two cores generate and consume, and 256 idle endpoints alone take about one
           core here: such rows would measure only the overload.)
- streams: (batched) 16 nodes at half the batched saturation rate with 16, 64, 256 streams per
           node: the batch size;
- http:    through the gateway (4 nodes x 16 streams), rising rates on the batched path.
On this 2-core machine the load generators and the client use the same cores as the broker; the
broker's own ceiling is stated as tokens/s divided by its CPU fraction (its rate at one whole core).
Output: the table on stdout, results/scale[-quick]-<date>.json (every row), results/scale[-quick]-
summary.json (the headline figures and targets), results/scale[-quick]-<date>.png (plots).
Usage: flock /tmp/pdbus-bench.lock .venv/bin/python -m harness.bench.scale_bench [--quick]
       [--nodes 1,16,64,256] [--streams-per-node 64] [--step-s 0.02] [--seconds 5] [--skip http,...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from harness.bench.scale_ceiling import measure_ceiling
from harness.bench.scale_point import Point, run_point
from harness.bench.scale_report import RESULTS, plot, print_row, print_table, summarize, write_results

PATHS = ("batched", "per-token")
RATE_NODES, RATE_STREAMS = 16, 64
LATENCY_BLOWN_MS = 100.0
HALF_REPEATS = 3
# The nodes sweep's offered rate: 256 idle endpoints take about one of the two cores here; at this
# rate the broker, the client and the tokens fit in the other (past it, heartbeats go missing).
NODES_RATE = 6_400
SECTIONS = ("ceiling", "rate", "half", "nodes", "streams", "http")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter points (~2 min)")
    parser.add_argument("--nodes", default=None, help="node counts of the nodes sweep (default 1,16,64,256)")
    parser.add_argument("--streams-per-node", type=int, default=64)
    parser.add_argument("--step-s", type=float, default=0.02, help="decode step of the nodes sweep")
    parser.add_argument("--max-tokens", type=int, default=256,
                        help="mean tokens per stream (each asks for 1/2..3/2 of it)")
    parser.add_argument("--seconds", type=float, default=None, help="measured window per point (5; quick 2)")
    parser.add_argument("--nodes-rate", type=float, default=NODES_RATE,
                        help="offered tokens/s cap of the nodes sweep, both paths")
    parser.add_argument("--nodes-per-process", type=int, default=32)
    parser.add_argument("--skip", default="", help=f"sections to leave out: {','.join(SECTIONS)}")
    parser.add_argument("--tag", default=None, help="results file prefix (default scale / scale-quick)")
    parser.add_argument("--out-dir", default=str(RESULTS), help="where the results files go")
    args = parser.parse_args(argv)
    args.nodes = [int(n) for n in (args.nodes or ("1,16" if args.quick else "1,16,64,256")).split(",")]
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    args.tag = args.tag or ("scale-quick" if args.quick else "scale")
    args.skip = {s for s in args.skip.split(",") if s}
    return args


class Runner:
    """Runs points, prints each row as it comes, keeps them all (with the section they belong to)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: list[dict] = []

    def point(self, section: str, path: str, nodes: int, streams_per_node: int, step_s: float,
              transport: str = "bus") -> dict:
        point = Point(path, nodes, streams_per_node, round(step_s, 6), transport, self.args.max_tokens,
                      self.args.seconds, self.args.nodes_per_process)
        try:
            row = run_point(point, settle_s=0.5 if self.args.quick else 1.0)
        except RuntimeError as exc:   # a process failed to start or answer: the row says so, the run goes on
            row = {**vars(point), "failed": str(exc)[:2000], "saturated": True}
        row["section"] = section
        self.rows.append(row)
        print_row(row)
        return row


    def ceiling(self, path: str, churn_tokens: int) -> dict:
        row = measure_ceiling(path, RATE_STREAMS, self.args.seconds, churn_tokens)
        self.rows.append(row)
        print_row(row)
        return row


def blown(row: dict) -> bool:
    return bool(row.get("failed")) or row["saturated"] or (row["p99_ms"] or 0) > LATENCY_BLOWN_MS


def rate_sweep(runner: Runner, path: str, rates: list[float]) -> float:
    """Raise the offered rate until it stops being relayed; the saturation rate (the most relayed)."""
    streams = RATE_NODES * RATE_STREAMS
    best = 0.0
    for rate in rates:
        row = runner.point("rate", path, RATE_NODES, RATE_STREAMS, streams / rate)
        best = max(best, row.get("tokens_per_s", 0.0))
        if blown(row):
            break
    return best


def rates_for(path: str, quick: bool) -> list[float]:
    """Offered rates, rising by x2 (quick) or x1.41 from a rate each path relays with ease."""
    base = 12_800 if path == "batched" else 6_400
    return [base * 2**i for i in range(4)] if quick else [base * 2 ** (i / 2) for i in range(10)]


def run(args: argparse.Namespace) -> Runner:
    runner = Runner(args)
    wanted: Callable[[str], bool] = lambda section: section not in args.skip   # noqa: E731
    saturation: dict[str, float] = {}
    for path in PATHS:
        if wanted("ceiling"):
            for churn_tokens in (args.max_tokens,) if args.quick else (args.max_tokens, 0):
                runner.ceiling(path, churn_tokens)
        if wanted("rate"):
            saturation[path] = rate_sweep(runner, path, rates_for(path, args.quick))
        if wanted("half") and saturation.get(path):
            for _ in range(1 if args.quick else HALF_REPEATS):   # a tail is one stall: the median of three
                runner.point("half", path, RATE_NODES, RATE_STREAMS, RATE_NODES * RATE_STREAMS / (saturation[path] / 2))
    # Both paths at one offered rate, one both relay comfortably: the rows of a node count compare.
    common_rate = args.nodes_rate
    if wanted("nodes"):
        for nodes in args.nodes:
            streams = nodes * args.streams_per_node
            for path in PATHS:
                runner.point("nodes", path, nodes, args.streams_per_node, max(args.step_s, streams / common_rate))
    half_rate = saturation.get("batched", 2 * NODES_RATE) / 2
    if wanted("streams") and not args.quick:
        for streams_per_node in (16, 64, 256):
            runner.point("streams", "batched", RATE_NODES, streams_per_node, RATE_NODES * streams_per_node / half_rate)
    if wanted("http"):
        for path, steps in (("batched", (0.02, 0.01, 0.005)), ("per-token", (0.02,))):
            for step_s in steps[:1] if args.quick else steps:
                if blown(runner.point("http", path, 4, 16, step_s, transport="http")):
                    break
    return runner


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runner = run(args)
    summary = summarize(runner.rows)
    paths = write_results(Path(args.out_dir), args.tag, runner.rows, summary, vars(args))   # first: the rows are the run
    paths.append(plot(runner.rows, paths[0].with_suffix(".png")))
    print_table(runner.rows, summary)
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
