"""Real `pdbus broker` / `pdbus node` processes for integration tests, with their JSON logs.

Each process's stderr is read by a thread into `events` (parsed JSON log lines, each stamped
with `seen_at`, our monotonic clock when the line arrived); tests poll with deadlines."""

from __future__ import annotations

import sys

from harness.cluster_procs import Proc, free_port  # noqa: F401  (free_port: used by the bus tests)


class LoggedProcess(Proc):
    """`harness.cluster_procs.Proc` with the bus tests' shorter default wait."""

    def wait_for(self, name: str, timeout: float = 15.0, count: int = 1, **fields: object) -> dict:
        return super().wait_for(name, timeout, count, **fields)


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


