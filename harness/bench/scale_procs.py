"""The processes of one `make bench-scale` point: the broker (bus_bench's launcher), load-generator
processes, load clients (bus or HTTP) and, for the HTTP run, the real `pdbus gateway`.

Contract:
- `Child(role, args)`: a child speaking JSON lines on stdout (harness/loadgen, the scale clients);
  `expect(event, timeout) -> dict` reads lines until that event (RuntimeError with the child's
  stderr tail if it exits or the time runs out); `send(line)` writes its stdin; `cpu_s()`;
  `stop()` (SIGTERM, then SIGKILL after 5 s).
- `machine_busy_s()`: CPU seconds the whole machine was busy (so what other work took is known).
- `Fleet` starts and owns them all: `broker()`, `loadgens(...)`, `clients(...)`, `gateway()`;
  `cpu_by_role() -> {role: CPU seconds so far, "machine": machine_busy_s()}`; `close()` stops every process it started, in
  reverse order, by its own handle. Usable as a context manager.
Children read `time.monotonic()`: one clock for every process on Linux (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from harness.bench.bus_bench import cpu_seconds, start_server
from harness.cluster_procs import REPO_ROOT, Proc, free_port, pdbus

GATEWAY_MODEL_NAME = "SmolLM2-135M-Instruct"   # what `pdbus gateway --model tiny` answers to (config/local.toml)


class Child:
    def __init__(self, role: str, args: list[str]) -> None:
        self.role = role
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the child; closed in stop())
        self.process = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._stderr, text=True, bufsize=1, cwd=REPO_ROOT)
        self.pid = self.process.pid

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.process.stdout], [], [], 0.1)[0]:
                line = self.process.stdout.readline()
                if not line:
                    break   # exited
                value = json.loads(line)
                if value.get("event") == event:
                    return value
            elif self.process.poll() is not None:
                break
        raise RuntimeError(f"{self.role} (pid {self.pid}) gave no {event!r}; stderr tail:\n{self.stderr_tail()}")

    def stderr_tail(self, num_chars: int = 2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-num_chars:]

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self._stderr.close()


class Fleet:
    def __init__(self) -> None:
        self.children: list[Child] = []
        self.pids: dict[str, list[int]] = defaultdict(list)
        self._broker: subprocess.Popen | None = None
        self._brokers: list[subprocess.Popen] = []
        self._gateway: Proc | None = None
        self.endpoint = ""
        self.broker_stop_timeouts = 0

    def broker(self, count: int = 1) -> str:
        """`count` brokers of one cluster (docs/PROTOCOL.md §1.12): every node and client gets all
        their endpoints; their CPU is summed under "broker"."""
        endpoints = []
        for _ in range(count):
            process, endpoint = start_server("broker")
            self._brokers.append(process)
            self.pids["broker"].append(process.pid)
            endpoints.append(endpoint)
        self._broker = self._brokers[0]
        self.endpoint = ",".join(endpoints)
        return self.endpoint

    def loadgens(self, num_nodes: int, per_process: int, step_s: float, max_batch: int, *,
                 per_token: bool, stamp: str, timeout: float = 60.0) -> list[Child]:
        children = []
        for first in range(0, num_nodes, per_process):
            count = min(per_process, num_nodes - first)
            args = ["-m", "harness.loadgen", "--broker", self.endpoint, "--nodes", str(count),
                    "--prefix", f"lg{first // per_process}", "--step-s", str(step_s),
                    "--max-batch", str(max_batch), "--stamp", stamp, *(["--per-token"] if per_token else [])]
            children.append(self._add(Child("loadgen", args)))
        for child in children:
            child.expect("ready", timeout)
        return children

    def clients(self, module: str, target: str, num_streams: int, num_processes: int, max_tokens: int,
                extra: tuple[str, ...] = (), timeout: float = 120.0) -> list[Child]:
        flag = "--url" if module.endswith("http") else "--broker"
        shares = [num_streams // num_processes + (i < num_streams % num_processes) for i in range(num_processes)]
        children = [self._add(Child("client", ["-m", module, flag, target, "--streams", str(n),
                                               "--max-tokens", str(max_tokens), "--seed", str(i), *extra]))
                    for i, n in enumerate(shares) if n]
        for child in children:
            child.expect("ready", timeout)
        return children

    def gateway(self, timeout: float = 60.0, workers: int = 1) -> str:
        """`pdbus gateway` (with `--workers N` > 1: N processes on one port, under a parent that
        holds it); every one of its processes counts as `gateway` CPU."""
        port = free_port()
        self._gateway = Proc(pdbus("gateway", "--model", "tiny", "--broker", self.endpoint, "--port", str(port),
                                   "--workers", str(workers), "--log-level", "info"),
                             env={"PDBUS__GATEWAY__STALL_TIMEOUT_S": "60"})
        started = self._gateway.wait_for("gateway_started", timeout=timeout)
        self.pids["gateway"] += [self._gateway.process.pid, *started.get("pids", [])]
        return f"http://127.0.0.1:{port}"

    def _add(self, child: Child) -> Child:
        self.children.append(child)
        self.pids[child.role].append(child.pid)
        return child

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of each role's processes, and `machine`: of every process on it."""
        used = {role: sum(_cpu_or_zero(pid) for pid in pids) for role, pids in self.pids.items()}
        return used | {"machine": machine_busy_s()}

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self._gateway is not None:
            self._gateway.stop()
        for broker in self._brokers:
            broker.terminate()
            try:
                broker.wait(5)
            except subprocess.TimeoutExpired:   # a broker that does not end on SIGTERM: ours to end anyway
                self.broker_stop_timeouts += 1
                broker.kill()
                broker.wait(5)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cpu_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    with open("/proc/cpuinfo") as info:
        model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "?")
    return f"{os.cpu_count()} cores, {model}"
