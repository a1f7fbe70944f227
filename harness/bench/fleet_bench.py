"""`make bench-scale`, the fleet half: the broker and the scheduler at 1,000 and 10,000 simulated nodes.

Contract: `python -m harness.bench.fleet_bench [--nodes 1000,3000,10000] [--seconds S] [--quick]
[--capacity-hz R] [--policy cluster|least-outstanding] [--out-dir results]`
- Heartbeat load, real processes and sockets (`heartbeat_load`): the real `pdbus broker` (the cluster
  policy unless `--policy` says otherwise; JSON logs) in its own process; `harness.bench.fleet_swarm`
  processes (at most `NODES_PER_SWARM` nodes each: every socket takes two file descriptors) register
  N idle decode nodes and heartbeat as the protocol says (an idle link every idle interval, 1 s;
  at the first size also with every link at the 250 ms interval, the protocol before idle links
  had their own, side by side). Over a steady window after every node
  registered: the broker's CPU (utime + stime from /proc; its Python thread and libzmq's I/O thread
  apart) as percent of one core, the swarms' CPU, messages/s each way, and whether any node was
  lost (the broker's `node_left` log events, the stats service's `nodes_by_role`, DISCONNECTs the
  nodes got). Then, at the first size: the same with every node sending CAPACITY at
  `--capacity-hz` (a busy node reports on every change, at most every 20 ms), and the floor
  (`fleet_floor`: the broker's shell and libzmq with a liveness-only core) under the same swarm.
- Where the time goes: `BrokerCore` alone, in process, fed the same heartbeats (`fleet_floor.core_cost`).
- A real idle node's side (`idle_endpoint`): 16 `bus.endpoint.Endpoint`s with no request, their CPU
  per endpoint, with idle links as now (1 s) and as before (250 ms).
- Scheduler (`scheduler.simulation`): the decode ring's balance and the key space one join and one
  leave move, exactly, against the ideal 1/(n+1) and 1/n; the bounded-load balance where affordable;
  the cost of one decode placement.
- Output: a table on stdout, `results/fleet-<UTC time>.json` (everything), `results/fleet-summary.json`
  (the headline figures) and `results/fleet-<UTC time>.png` (CPU against nodes).
Target (issue "Scale out"): heartbeats from 1,000 nodes cost the broker at most 10 % of one core.
Run under `flock /tmp/pdbus-bench.lock`: on two cores the figures mean nothing beside another bench.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import zmq

from bus import codec
from bus import constants as c
from bus.messages import Disconnect, Final, Ready, Request
from harness.bench.bus_bench import cpu_seconds
from harness.bench.fleet_floor import core_cost
from harness.bench.fleet_report import heartbeat_line, machine, print_tables, write_results
from harness.bench.fleet_swarm import raise_fd_limit
from harness.bench.idle_endpoint import idle_endpoint_cost
from harness.bench.kv_cpu import thread_cpu_seconds
from harness.cluster_procs import REPO_ROOT, Proc, free_port
from scheduler.policy import SchedulerSettings
from scheduler.simulation import balance, decision_seconds, membership_seconds, ring_figures

TARGET_PCT = 10.0
NODES_PER_SWARM = 2500
SETTLE_S = 2.0   # after the last registration: logs flushed, heartbeat phases spread
BOUNDED_BUDGET_S = 20.0   # the bounded-load balance is measured where its placements take less


class Swarm:
    """One `fleet_swarm` process: its JSON lines arrive on a queue (read by a thread)."""

    def __init__(self, endpoint: str, first: int, count: int, interval_ms: int, idle_ms: int, capacity_hz: float,
                 register_timeout_s: float = 120.0, window: int = 64) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.bench.fleet_swarm", endpoint, "--first", str(first),
             "--count", str(count), "--interval-ms", str(interval_ms), "--idle-interval-ms", str(idle_ms),
             "--capacity-hz", str(capacity_hz),
             "--register-timeout", str(register_timeout_s), "--window", str(window)],
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def next_line(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.process.poll() is not None:
                    raise RuntimeError(f"a swarm exited with {self.process.returncode}") from None
                if time.monotonic() > deadline:
                    raise

    def counters(self) -> dict:
        self._command("stats")
        return self.next_line(10)

    def _command(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        try:
            self._command("stop")
            self.process.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()


class Server:
    """The process the swarms load: the real broker, or the floor (`fleet_floor`: its shell alone)."""

    def __init__(self, kind: str, interval_ms: int, idle_ms: int, policy: str = "cluster") -> None:
        self.kind, self.endpoint = kind, f"tcp://127.0.0.1:{free_port()}"
        if kind == "broker":
            self.proc = Proc([sys.executable, "-m", "nodes.cli", "broker", "--endpoint", self.endpoint,
                              "--policy", policy, "--heartbeat-ms", str(interval_ms),
                              "--heartbeat-idle-ms", str(idle_ms), "--log-format", "json"])
            self.proc.wait_for("broker_started", timeout=30)
        else:
            self.proc = Proc([sys.executable, "-m", "harness.bench.fleet_floor", self.endpoint, str(idle_ms)])
            time.sleep(0.5)
        self.pid = self.proc.process.pid

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: `main` (the Python thread), `zmq` (libzmq's I/O thread), `total`."""
        threads = thread_cpu_seconds(self.pid)
        return {"main": threads.get("main", 0.0), "zmq": threads.get("zmq", 0.0), "total": cpu_seconds(self.pid)}

    def stats(self, context: zmq.Context) -> dict:
        if self.kind != "broker":
            return {}
        try:
            return broker_stats(context, self.endpoint)
        except TimeoutError as exc:   # a broker that fell behind answers late: say so, keep the rest
            return {"error": str(exc)}

    def stop(self) -> None:
        # The broker first: its nodes then get DISCONNECT, not 10,000 connection losses to probe.
        self.proc.process.terminate()
        try:
            self.proc.process.wait(10)
        except subprocess.TimeoutExpired:   # an overloaded broker may not get to its signal handler
            self.proc.process.kill()
            self.proc.process.wait(10)


def broker_stats(context: zmq.Context, endpoint: str, timeout_s: float = 15.0) -> dict:
    """The broker's own stats service (docs/PROTOCOL.md §1.3 item 9), asked as a gateway."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    try:
        socket.send_multipart(codec.encode(Ready("gateway", f"fleet-bench-{uuid.uuid4().hex[:8]}")))
        request_id = uuid.uuid4().hex
        socket.send_multipart(codec.encode(Request(c.BROKER_STATS_SERVICE, request_id)))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if socket.poll(500):
                message = codec.decode(socket.recv_multipart())
                if isinstance(message, Final) and message.request_id == request_id:
                    socket.send_multipart(codec.encode(Disconnect("shutdown", "stats read")))
                    return dict(message.body)
        raise TimeoutError(f"the broker's stats service did not answer in {timeout_s:g} s")
    finally:
        socket.close()


def _snapshot(server: Server, swarms: list[Swarm]) -> dict:
    counters = [swarm.counters() for swarm in swarms]
    return {"at": time.monotonic(), "server_cpu": server.cpu(),
            "swarm_cpu": sum(cpu_seconds(s.process.pid) for s in swarms),
            **{key: sum(c[key] for c in counters) for key in counters[0] if key != "worst_send_gap_s"},
            "worst_send_gap_s": max(c["worst_send_gap_s"] for c in counters)}


def heartbeat_load(num_nodes: int, seconds: float, capacity_hz: float = 0.0, *, server_kind: str = "broker",
                   policy: str = "cluster", settle_s: float = SETTLE_S,
                   interval_ms: int = int(c.DEFAULT_HEARTBEAT_INTERVAL_S * 1000),
                   idle_ms: int = int(c.DEFAULT_IDLE_HEARTBEAT_INTERVAL_S * 1000)) -> dict:
    """Start the server and `num_nodes` simulated idle nodes; measure a steady window of `seconds`.
    `idle_ms` is the idle links' heartbeat interval (PROTOCOL.md §1.4); `idle_ms == interval_ms`
    is the protocol before idle links had their own (every link heartbeating every interval)."""
    fd_limit = raise_fd_limit()   # the server and the swarms inherit it
    server = Server(server_kind, interval_ms, idle_ms, policy)
    swarms: list[Swarm] = []
    context = zmq.Context()
    try:
        at_start, started = server.cpu()["total"], time.monotonic()
        # A fleet that cannot register in this time is measured as it is (the rows say how many made it).
        register_timeout_s = 30 + num_nodes / 200
        for first in range(0, num_nodes, NODES_PER_SWARM):
            swarms.append(Swarm(server.endpoint, first, min(NODES_PER_SWARM, num_nodes - first),
                                interval_ms, idle_ms, capacity_hz, register_timeout_s))
        registrations = [swarm.next_line(timeout=register_timeout_s + 60) for swarm in swarms]
        register = {"registered": sum(r["registered"] for r in registrations), "fd_limit": fd_limit,
                    "register_s": round(time.monotonic() - started, 2),
                    "register_server_cpu_s": round(server.cpu()["total"] - at_start, 2)}
        time.sleep(settle_s)
        before = _snapshot(server, swarms)
        time.sleep(seconds)
        after = _snapshot(server, swarms)
        stats = server.stats(context)
        left = server.proc.find("node_left", role="decode")   # not the stats reader's own goodbye
    finally:
        server.stop()
        for swarm in swarms:
            swarm.stop()
        context.term()
    label = f"broker ({policy} policy)" if server_kind == "broker" else "floor (shell + liveness only)"
    if idle_ms == interval_ms:
        label += f", idle = {interval_ms} ms (before)"
    return {"server": label, "nodes": num_nodes, "capacity_hz": capacity_hz, "interval_ms": interval_ms,
            "idle_ms": idle_ms, "before": idle_ms == interval_ms, **register,
            **_rates(before, after), "nodes_by_role": stats.get("nodes_by_role", {}),
            "stats_error": stats.get("error"), "nodes_left": len(left),
            "left_reasons": sorted({e.get("reason", "?") for e in left})}


def _rates(before: dict, after: dict) -> dict:
    window = after["at"] - before["at"]

    def rate(key: str) -> float:
        return (after[key] - before[key]) / window

    to_server = rate("sent_heartbeat") + rate("sent_capacity") + rate("sent_ready")
    cpu = {k: after["server_cpu"][k] - before["server_cpu"][k] for k in ("main", "zmq", "total")}
    return {
        "window_s": round(window, 2), "broker_cpu_pct": 100 * cpu["total"] / window,
        "broker_main_pct": 100 * cpu["main"] / window, "broker_zmq_pct": 100 * cpu["zmq"] / window,
        "swarm_cpu_pct": 100 * (after["swarm_cpu"] - before["swarm_cpu"]) / window,
        "to_broker_per_s": to_server, "from_broker_per_s": rate("received"),
        "broker_us_per_msg": 1e6 * cpu["total"] / max(1.0, (to_server + rate("received")) * window),
        "links_lost": after["links_lost"], "disconnects": after["disconnects"], "reconnects": after["reconnects"],
        "broker_silences": after["broker_silences"], "registered_at_end": after["registered"],
        "send_blocked": after["send_blocked"] - before["send_blocked"],
        "swarm_worst_send_gap_ms": round(1000 * after["worst_send_gap_s"], 1),
        # The broker answers every heartbeat interval: a tenth of that means it stopped serving.
        "broker_stalled": rate("received") < 0.1 * to_server,
    }


def scheduler_rows(sizes: list[int], quick: bool = False) -> list[dict]:
    """Ring figures (exact) per size; the bounded policy's balance with 8 concurrent sessions a node
    where it is affordable: each placement scans every node (`decode_decision_ms`)."""
    rows = []
    for num_nodes in sizes:
        ring = ring_figures(num_nodes)
        decision_s = decision_seconds(num_nodes, 100 if num_nodes > 2000 else 300)
        bounded = None
        if not quick and 8 * num_nodes * decision_s < BOUNDED_BUDGET_S:
            bounded = balance(num_nodes, 8 * num_nodes, epsilon=SchedulerSettings().epsilon)
        rows.append({"nodes": num_nodes, "ring_max_mean": ring.max_share, "ring_min_mean": ring.min_share,
                     "bounded_max_mean": bounded, "join_moved": ring.join_moved, "join_ideal": ring.join_ideal,
                     "leave_moved": ring.leave_moved, "leave_ideal": ring.leave_ideal,
                     "decode_decision_ms": 1000 * decision_s,
                     **dict(zip(("join_ms", "leave_ms"), (1000 * t for t in membership_seconds(num_nodes)), strict=True))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,3000,10000", help="comma-separated fleet sizes")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady window per size")
    parser.add_argument("--capacity-hz", type=float, default=1.0,
                        help="CAPACITY reports per node per second in the extra row at the first size (0: none)")
    parser.add_argument("--policy", choices=["cluster", "least-outstanding"], default="cluster",
                        help="the broker's routing policy (cluster: what `pdbus broker` runs)")
    parser.add_argument("--quick", action="store_true", help="3 s windows, no CAPACITY row, no bounded balance")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "results")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    seconds = 3.0 if args.quick else args.seconds
    rows: list[dict] = []

    def measure(num_nodes: int, capacity_hz: float = 0.0, server_kind: str = "broker", policy: str = args.policy,
                **interval: int) -> None:
        rows.append(heartbeat_load(num_nodes, seconds, capacity_hz, server_kind=server_kind, policy=policy,
                                   **interval))
        print(heartbeat_line(rows[-1]), flush=True)

    for num_nodes in sizes:
        measure(num_nodes)
    before_ms = int(c.DEFAULT_HEARTBEAT_INTERVAL_S * 1000)   # side by side: every link at the short interval
    measure(sizes[0], idle_ms=before_ms)
    if args.policy == "cluster" and not args.quick:   # the heartbeats alone, without the ring's joins and leaves
        for num_nodes in sizes[1:]:
            measure(num_nodes, policy="least-outstanding")
    if args.capacity_hz > 0 and not args.quick:
        measure(sizes[0], capacity_hz=args.capacity_hz)
    measure(sizes[0], server_kind="floor")   # what the shell and libzmq cost without the protocol
    core = [{"nodes": n, **core_cost(n)} for n in sizes]
    # A real idle node's side: 16 `Endpoint`s in one process, idle links as now and as before.
    endpoint = [idle_endpoint_cost(16, seconds, idle_ms) for idle_ms in (1000, before_ms)]
    scheduler = scheduler_rows(sizes, args.quick)
    report = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
              "target_pct": TARGET_PCT, "heartbeat": rows, "core": core, "endpoint": endpoint,
              "scheduler": scheduler}
    print_tables(report)
    for path in write_results(report, args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
