"""`python -m harness.loadgen --broker tcp://... --nodes 64 [--step-s 0.02] [--max-batch 64]
[--per-token] [--stamp field]`: one process of engine-less decode nodes (harness/loadgen/node.py).

Contract with whoever starts it (harness/bench/scale_bench.py), one JSON object per stdout line:
- `{"event": "ready", "node_ids": [...]}` once the broker acknowledged every node (exit 1 if not
  within `--register-timeout`);
- on SIGTERM or SIGINT: `{"event": "stats", "timeline": [[t, tokens_sent], ...], "counters": {...},
  "endpoint": {...}}` (the cores' counters and the endpoints' metrics, summed over the nodes),
  then every node DISCONNECTs and the process exits 0.
Node ids are `<prefix>-<i>`; node i's first step is offset by i/N of a step, so the nodes of a
process do not all step at the same instant (nor do real engines).
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import threading
import time
from collections import Counter

import zmq

from bus.log import configure_logging
from harness.loadgen.core import LoadGenCore, Stamp
from harness.loadgen.node import Driver, LoadGenNode


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--nodes", type=int, default=1, help="decode nodes in this process")
    parser.add_argument("--prefix", default="loadgen", help="node ids are <prefix>-<i>")
    parser.add_argument("--step-s", type=float, default=0.02, help="seconds per decode step")
    parser.add_argument("--max-batch", type=int, default=64, help="streams a node runs at most (then `full`)")
    parser.add_argument("--per-token", action="store_true", help="one PARTIAL per token (the old path)")
    parser.add_argument("--stamp", choices=[s.value for s in Stamp], default=Stamp.FIELD.value)
    parser.add_argument("--register-timeout", type=float, default=30.0)
    parser.add_argument("--switch-interval-ms", type=float, default=1.0,
                        help="GIL switch interval: how long the stepping thread may keep an endpoint's "
                             "I/O thread waiting (Python's 5 ms shows in p99 latency)")
    return parser.parse_args(argv)


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def build_nodes(args: argparse.Namespace, context: zmq.Context) -> list[LoadGenNode]:
    start = time.monotonic() + 0.1
    return [LoadGenNode(args.broker, LoadGenCore(f"{args.prefix}-{i}", args.step_s, args.max_batch,
                                                 start + args.step_s * i / args.nodes, Stamp(args.stamp)),
                        context, per_token=args.per_token)
            for i in range(args.nodes)]


def wait_registered(nodes: list[LoadGenNode], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(node.endpoint.wait_registered(max(0.0, deadline - time.monotonic())) for node in nodes)


def stats(nodes: list[LoadGenNode], driver: Driver) -> dict[str, object]:
    counters: Counter[str] = Counter()
    metrics: Counter[str] = Counter()
    for node in nodes:
        counters.update({k: v for k, v in node.core.counters.items() if k != "max_batch_seen"})
        metrics.update(node.endpoint.metrics())
    counters["max_batch_seen"] = max(node.core.counters["max_batch_seen"] for node in nodes)
    counters["ignored"] = sum(node.num_ignored for node in nodes)
    return {"timeline": [[round(t, 4), n] for t, n in driver.timeline], "counters": dict(counters),
            "endpoint": dict(metrics)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(level="error")
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    context = zmq.Context()
    nodes = [node.start() for node in build_nodes(args, context)]
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    try:
        if not wait_registered(nodes, args.register_timeout):
            print(f"loadgen: nodes not registered within {args.register_timeout}s", file=sys.stderr)
            return 1
        gc.freeze()   # the nodes and endpoints live to the end: keep full collections short
        emit("ready", node_ids=[node.core.node_id for node in nodes])
        driver = Driver(nodes)
        driver.run(stop)
        emit("stats", **stats(nodes, driver))
        return 0
    finally:
        for node in nodes:
            node.stop()
        context.term()


if __name__ == "__main__":
    sys.exit(main())
