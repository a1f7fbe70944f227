"""Real `pdbus broker` / `pdbus node` processes for integration tests, with their JSON logs.

Each process's stderr is read by a thread into `events` (parsed JSON log lines, each stamped
with `seen_at`, our monotonic clock when the line arrived); tests poll with deadlines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LoggedProcess:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.events: list[dict] = []
        self.raw: list[str] = []
        self.process = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.raw.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                event["seen_at"] = time.monotonic()
                self.events.append(event)

    def find(self, name: str, **fields: object) -> list[dict]:
        return [e for e in list(self.events)
                if e.get("event") == name and all(e.get(k) == v for k, v in fields.items())]

    def wait_for(self, name: str, timeout: float = 15.0, count: int = 1, **fields: object) -> dict:
        """The `count`-th log event `name` with `fields`; fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.find(name, **fields)
            if len(found) >= count:
                return found[count - 1]
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {name} {fields} (x{count}) within {timeout}s; log tail:\n"
                             + "".join(self.raw[-20:]))

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def stop(self) -> None:
        """SIGCONT (in case it is stopped), SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def pdbus(*args: str) -> list[str]:
    return [sys.executable, "-m", "nodes.cli", *args, "--log-format", "json"]


def start_broker(port: int, *extra: str) -> LoggedProcess:
    broker = LoggedProcess(pdbus("broker", "--endpoint", f"tcp://127.0.0.1:{port}", *extra))
    broker.wait_for("broker_started")
    return broker


def start_node(port: int, role: str, node_id: str) -> LoggedProcess:
    return LoggedProcess(pdbus("node", "--idle", "--role", role, "--node-id", node_id,
                               "--broker", f"tcp://127.0.0.1:{port}"))


def python_process(code: str, *args: str, env: dict[str, str] | None = None) -> LoggedProcess:
    return LoggedProcess([sys.executable, "-c", code, *args], env=env)


def timestamp(event: dict) -> float:
    """A log event's own ISO timestamp, as seconds (for intervals inside one process)."""
    from datetime import datetime
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


