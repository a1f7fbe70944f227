"""What an idle node's bus link costs the node: real `bus.endpoint.Endpoint`s (decode role, no
request) registered with a real broker, their process's CPU over a steady window.

Contract: `idle_endpoint_cost(num_endpoints, seconds, idle_ms) -> dict` starts `pdbus broker` (the
given idle interval) and one process holding `num_endpoints` endpoints, each with its own I/O
thread as in a node; returns the endpoints' CPU in ms per second per endpoint and the broker's
percent of a core. `idle_ms == 250` is the protocol before idle links had their own interval
(timers every 50 ms, a heartbeat every 250 ms each way). `python -m harness.bench.idle_endpoint
[--endpoints 16] [--seconds 10]` prints both side by side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from harness.bench.bus_bench import cpu_seconds
from harness.cluster_procs import Proc, free_port

HOLDER = """
import os, sys, time
ready = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)   # the endpoints' log lines go to stderr: stdout carries only the ready line
from bus.endpoint import Endpoint
from bus.liveness import HeartbeatConfig
broker, count, idle_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
config = HeartbeatConfig(idle_interval_s=idle_ms / 1000)
endpoints = [Endpoint(broker, "decode", f"idle-{i}", heartbeat=config).start() for i in range(count)]
assert all(e.wait_registered(30) for e in endpoints)
print("ready", file=ready, flush=True)
sys.stdin.read()
for e in endpoints:
    e.stop()
"""


def idle_endpoint_cost(num_endpoints: int, seconds: float, idle_ms: int, settle_s: float = 2.0) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    broker = Proc([sys.executable, "-m", "nodes.cli", "broker", "--endpoint", endpoint,
                   "--heartbeat-idle-ms", str(idle_ms), "--log-format", "json"])
    holder = None
    try:
        broker.wait_for("broker_started", timeout=30)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, endpoint, str(num_endpoints), str(idle_ms)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            raise AssertionError("the endpoints did not register")
        time.sleep(settle_s)
        before = (cpu_seconds(holder.pid), cpu_seconds(broker.process.pid), time.monotonic())
        time.sleep(seconds)
        after = (cpu_seconds(holder.pid), cpu_seconds(broker.process.pid), time.monotonic())
    finally:
        if holder is not None:
            holder.communicate("", timeout=60)   # each endpoint says goodbye (up to 2 s each)
        broker.process.terminate()
        broker.process.wait(10)
    window = after[2] - before[2]
    return {"endpoints": num_endpoints, "idle_ms": idle_ms, "window_s": round(window, 2),
            "endpoint_ms_per_s": 1000 * (after[0] - before[0]) / window / num_endpoints,
            "broker_cpu_pct": 100 * (after[1] - before[1]) / window}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    for idle_ms in (1000, 250):
        row = idle_endpoint_cost(args.endpoints, args.seconds, idle_ms)
        print(f"idle interval {idle_ms:>4} ms: {row['endpoint_ms_per_s']:.2f} ms CPU/s per idle endpoint "
              f"({args.endpoints} in one process), broker {row['broker_cpu_pct']:.2f} % of a core", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
