"""Run one pdbus component (broker, node, gateway) as a child process and keep it running: the body
of its Ray actor, written without Ray so that tests drive it with plain processes.

Contract: `ComponentRunner(spec, config_text, policy=None, where=dict, roles=None)` writes the
config text to `config_path(name, text)` (on whichever host the actor landed) and starts `spec.argv`
at once, from a keeper thread that lives as long as the runner; `supervision.Supervision` decides what an exit
means (non-zero: start it again after a back-off; 0 or asked to stop: stay down).
- `roles` (a `RoleBook`: `recall(name) -> role | None`, `remember(name, role)`): where a node's
  role switches are written as they happen, and read once at the start, so an actor Ray
  reconstructs (its raylet died) brings its node back in the role it last switched to, not the
  planned one (the actor clears the entry when it starts fresh).
- `info() -> dict`: name, kind, role, state, ready, restarts, last_exit, pid (the child's, or
  None), actor_pid, plus `where()` (the actor adds its Ray node and IP).
- `drain(force=False)`: SIGTERM the child — a node drains (takes no new work, finishes or hands
  over its streams, exits 0), a broker or gateway stops; `force` sends SIGKILL. Either way it is
  not started again. `wait_exited(timeout) -> bool`: whether it is down for good.
- `close()`: SIGKILL, wait, remove the config file (`down` does, before Ray kills the actor).
  `tail(n)`: its last log lines.
The child gets PR_SET_PDEATHSIG = SIGKILL: when the actor's worker dies (`ray.kill`, a lost
raylet) the child dies with it, at once, so the actor Ray restarts elsewhere is the only process
with that node id (a drain on SIGTERM would keep the old one serving meanwhile). PDEATHSIG fires
when the *thread* that forked the child exits, which is why the keeper thread forks every child
and never ends before its child does. Its stderr (JSON log lines) goes on to the actor's stderr
(Ray's worker log) and is read for the readiness and role events.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from nodes.launcher import parse_line
from nodes.ray_pools.pool_plan import CONFIG_SLOT, ComponentSpec
from nodes.ray_pools.supervision import SWITCHABLE_ROLES, RestartPolicy, Supervision, argv_for_role

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here: no dlopen after fork
TAIL_LINES = 40


def resolve_argv(argv: tuple[str, ...], config_path: str, python: str = sys.executable) -> tuple[str, ...]:
    """The plan's argv on this host: this interpreter (the plan was made on the driver's) and the
    config file written here."""
    return (python, *(config_path if arg == CONFIG_SLOT else arg for arg in argv[1:]))


def config_path(name: str, config_text: str) -> Path:
    """Where a component's config is written on this host: named by component and content, so an
    actor Ray restarts here finds (and rewrites) the same file rather than leaving another behind."""
    digest = hashlib.sha256(config_text.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "pdbus-ray" / f"{name}-{digest}.toml"


def _killed_with(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:   # in the child, between fork and exec
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:   # the parent died before prctl took effect
            os._exit(1)
    return preexec


class RoleBook(Protocol):
    """Where a node's current role outlives its actor (Ray's KV store in a pool)."""

    def recall(self, name: str) -> str | None: ...

    def remember(self, name: str, role: str) -> None: ...


class ComponentRunner:
    def __init__(self, spec: ComponentSpec, config_text: str, *, policy: RestartPolicy | None = None,
                 where: Callable[[], dict] = dict, roles: RoleBook | None = None) -> None:
        self.spec, self.where, self.config_text, self.roles = spec, where, config_text, roles
        self.config_path = config_path(spec.name, config_text)
        self.argv = resolve_argv(spec.argv, str(self.config_path))
        recalled = roles.recall(spec.name) if roles is not None else None
        role = recalled if recalled in SWITCHABLE_ROLES and spec.kind in SWITCHABLE_ROLES else spec.kind
        self.supervision = Supervision(spec.ready_event, role, policy)
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._wake = threading.Event()   # cuts a back-off short when asked to stop
        self._done = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name=f"keep-{spec.name}", daemon=True)
        self._keeper.start()

    # -- the keeper thread -----------------------------------------------------------------

    def _keep(self) -> None:
        try:
            while (process := self._spawn()) is not None:
                self._follow(process)
                with self._lock:
                    delay = self.supervision.exited(process.wait(), time.monotonic())
                if delay is None or self._wake.wait(delay):
                    break
        finally:
            self._done.set()

    def _spawn(self) -> subprocess.Popen | None:
        with self._lock:
            if not self.supervision.keeps_running:
                return None
            argv = argv_for_role(self.argv, self.supervision.role)
            self.config_path.parent.mkdir(parents=True, exist_ok=True)
            self.config_path.write_text(self.config_text)   # each time: /tmp may have been cleaned
            self._process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                text=True, errors="replace", preexec_fn=_killed_with(os.getpid()), process_group=0,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.spec.env})
            self.supervision.started(time.monotonic())
            return self._process

    def _follow(self, process: subprocess.Popen) -> None:
        assert process.stderr is not None   # opened with stderr=PIPE
        for line in process.stderr:
            sys.stderr.write(line)
            self._tail.append(line.rstrip("\n"))
            event = parse_line(line)
            if event is None:
                continue
            with self._lock:
                role = self.supervision.role
                self.supervision.observe(event)
                switched = self.supervision.role if self.supervision.role != role else None
            if switched is not None and self.roles is not None:
                self.roles.remember(self.spec.name, switched)

    # -- what the actor answers ------------------------------------------------------------

    def info(self) -> dict:
        with self._lock:
            process = self._process
            alive = process is not None and process.poll() is None
            return {"name": self.spec.name, "kind": self.spec.kind, **self.supervision.snapshot(),
                    "pid": process.pid if alive and process else None, "actor_pid": os.getpid(), **self.where()}

    def drain(self, force: bool = False) -> None:
        with self._lock:
            self.supervision.stop_requested()
            self._signal(signal.SIGKILL if force else signal.SIGTERM)
        self._wake.set()

    def wait_exited(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def close(self, timeout: float = 10.0) -> bool:
        self.drain(force=True)
        exited = self.wait_exited(timeout)
        self.config_path.unlink(missing_ok=True)
        return exited

    def tail(self, num_lines: int = TAIL_LINES) -> list[str]:
        return list(self._tail)[-num_lines:]

    def _signal(self, number: int) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)   # a stopped process cannot act on SIGTERM
                process.send_signal(number)
