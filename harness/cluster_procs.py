"""Start a whole cluster as real processes on loopback: a broker and N prefill, M decode (and K
colocated `both`) nodes on free ports, from one generated config file. Used by the cluster
integration tests and the chaos harness.

Contract:
    with ClusterProcs(num_prefill=2, num_decode=2, model="tiny", kv_quant="raw") as cluster:
        cluster.broker_endpoint                    # "tcp://127.0.0.1:PORT"
        cluster.nodes["decode-0"]                  # a `Proc` (its JSON log events, signal, stop)
        cluster.kill("decode-0")                   # SIGKILL (or any signal)
        cluster.restart_broker(kill=True)          # same port; nodes re-register
With `num_brokers=k` the config lists k brokers (`broker_endpoint` is their comma-separated
addresses, every node registers with each: docs/PROTOCOL.md §1.12); `brokers[i]` is the i-th
process, `broker` the first, `kill_broker(i)` / `restart_broker(kill, index=i)` act on one.
Node ids are `prefill-i`, `decode-i`, `both-i`. `start()` returns once the broker logged every
node joining. Every process pins one torch thread with passive OpenMP waits (two cores shared).
`extra_args` adds flags per role (e.g. {"prefill": ["--test-prefill-delay-ms", "2000"]});
`settings` adds/overrides config sections ({"decode": {"num_kv_blocks": 64}}).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}


def poll_until(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    """The first truthy value of `predicate()` within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    return None


def gateway_ready(proc: Proc, url: str, timeout: float) -> bool:
    """Wait for a gateway process to start and its `/ready` to answer 200 (nodes registered)."""
    import contextlib

    import httpx

    def ready() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/ready", timeout=5).status_code == 200
        return False

    proc.wait_for("gateway_started", timeout=timeout)
    return bool(poll_until(ready, timeout, interval=0.1))


def free_port() -> int:
    """A loopback TCP port free now, for a child process to bind later. It is taken below the
    kernel's ephemeral range where it can: a port that bind(0) handed out is back in that range, and
    any connect() may take it as its source port before the child binds it (with dozens of
    processes connecting during a test run, that is a flake waiting to happen)."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(max(1024, low - 12_000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:   # every probe taken: the kernel's choice after all
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default


class Proc:
    """A child process whose stderr JSON log lines are collected by a reader thread."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.process = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, env={**os.environ, **NODE_ENV, **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None   # opened with stderr=PIPE
        for line in self.process.stderr:
            self.raw.append(line)
            seen_at = time.monotonic()   # when the line arrived here, for intervals across processes
            self.events.extend({**event, "seen_at": seen_at} for event in parse_log_line(line))

    def find(self, name: str, **fields: Any) -> list[dict]:
        return [e for e in list(self.events) if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())]

    def wait_for(self, name: str, timeout: float = 60.0, count: int = 1, **fields: Any) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.find(name, **fields)
            if len(found) >= count:
                return found[count - 1]
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {name} {fields} (x{count}) within {timeout}s; log tail:\n" + self.log_tail())

    def log_tail(self, num_lines: int = 25) -> str:
        return "".join(self.raw[-num_lines:])

    def wait_exit(self, timeout: float = 5.0) -> int | None:
        """The exit code of a process that has ended, once its last log lines are read."""
        self.process.wait(timeout)
        self._reader.join(timeout)
        return self.process.returncode

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, number: int) -> None:
        if self.alive:
            self.process.send_signal(number)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def parse_log_line(line: str) -> list[dict]:
    """The JSON events on one stderr line. Two threads logging at once can leave two objects on
    one line (a message and its newline are separate writes), so decode them one after another."""
    events, position, decoder = [], 0, json.JSONDecoder()
    line = line.strip()
    while position < len(line):
        try:
            event, position = decoder.raw_decode(line, position)
        except ValueError:
            break
        if isinstance(event, dict):
            events.append(event)
    return events


def pdbus(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodes.cli", *args, "--log-format", "json"]


def _toml_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def render_config(sections: dict[str, dict[str, Any]]) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()) + "\n"
                   for name, values in sections.items())


class ClusterProcs:
    def __init__(self, *, num_prefill: int = 1, num_decode: int = 1, num_both: int = 0, model: str = "tiny",
                 kv_quant: str = "raw", settings: dict[str, dict[str, Any]] | None = None,
                 extra_args: dict[str, list[str]] | None = None, log_level: str = "info",
                 num_brokers: int = 1) -> None:
        self.counts = {"prefill": num_prefill, "decode": num_decode, "both": num_both}
        self.ports = [free_port() for _ in range(num_brokers)]
        self.port = self.ports[0]
        self.broker_endpoint = ",".join(f"tcp://127.0.0.1:{port}" for port in self.ports)
        self.extra_args = extra_args or {}
        self.log_level = log_level
        self._dir = tempfile.TemporaryDirectory(prefix="pdbus-cluster-")
        self.config_path = Path(self._dir.name) / "cluster.toml"
        sections: dict[str, dict[str, Any]] = {
            "broker": {"endpoint": self.broker_endpoint},
            "heartbeat": {"interval_ms": 250, "liveness": 3},
            "engine": {"model": model, "dtype": "float32", "num_threads": 1},
            "prefill": {"max_batch_tokens": 2048, "max_wait_ms": 5},
            "decode": {"num_kv_blocks": 512, "max_num_seqs": 16},
            "kv": {"quant": kv_quant, "compression": "none" if kv_quant == "raw" else "auto", "compile": False},
            "scheduler": {"local_suffix_tokens": 64},
            "failover": {"max_retries": 3},
        }
        for name, values in (settings or {}).items():
            sections.setdefault(name, {}).update(values)
        self.settings = sections
        self.config_path.write_text(render_config(sections))
        self.broker: Proc | None = None
        self.brokers: list[Proc | None] = [None] * num_brokers
        self.old_brokers: list[Proc] = []   # killed by restart_broker, kept for their logs
        self.nodes: dict[str, Proc] = {}

    def _common(self) -> list[str]:
        return ["--config", str(self.config_path), "--log-level", self.log_level]

    def start_broker(self, index: int = 0) -> Proc:
        broker = self.brokers[index] = Proc(pdbus("broker", *self._common(), "--index", str(index)))
        if index == 0:
            self.broker = broker
        broker.wait_for("broker_started", timeout=30)
        return broker

    def start_node(self, role: str, node_id: str) -> Proc:
        command = "node" if role == "both" else role
        args = ["--role", "both"] if role == "both" else []
        node = Proc(pdbus(command, *args, "--node-id", node_id, *self._common(), *self.extra_args.get(role, [])))
        self.nodes[node_id] = node
        return node

    def start(self, timeout: float = 120.0) -> Self:
        for index in range(len(self.brokers)):
            self.start_broker(index)
        for role, count in self.counts.items():
            for i in range(count):
                self.start_node(role, f"{role}-{i}")
        deadline = time.monotonic() + timeout
        for node_id, node in self.nodes.items():
            self._wait_joined(node_id, node, deadline)
        return self

    def _wait_joined(self, node_id: str, node: Proc, deadline: float) -> None:
        """Every broker's node_joined for `node_id`; a node that exits first fails at once, with its
        own log tail (waiting out the timeout on the broker's log would say nothing of why)."""
        while not all(broker is not None and broker.find("node_joined", node_id=node_id) for broker in self.brokers):
            if not node.alive:
                raise AssertionError(f"{node_id} exited with {node.wait_exit()} before joining; "
                                     "its log tail:\n" + node.log_tail())
            if time.monotonic() > deadline:
                assert self.broker is not None   # start() started every broker first
                raise AssertionError(f"no node_joined for {node_id} in time; the broker's log tail:\n"
                                     + self.broker.log_tail())
            time.sleep(0.02)

    def kill(self, node_id: str, number: int = signal.SIGKILL) -> None:
        self.nodes[node_id].signal(number)
        if number == signal.SIGKILL:
            self.nodes[node_id].process.wait(5)

    def kill_broker(self, index: int = 0) -> None:
        old = self.brokers[index]
        assert old is not None, "that broker was never started"
        old.signal(signal.SIGKILL)
        old.process.wait(10)
        self.old_brokers.append(old)

    def restart_broker(self, kill: bool = True, index: int = 0) -> Proc:
        old = self.brokers[index]
        assert old is not None, "that broker was never started"
        old.signal(signal.SIGKILL if kill else signal.SIGTERM)
        old.process.wait(10)
        if old not in self.old_brokers:
            self.old_brokers.append(old)
        return self.start_broker(index)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.signal(signal.SIGTERM)
        for node in self.nodes.values():
            node.stop()
        for broker in self.brokers:
            if broker is not None:
                broker.stop()
        self._dir.cleanup()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
