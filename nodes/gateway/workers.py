"""`pdbus gateway --workers N`: a parent process that runs N gateway workers on one host:port.

One gateway process is capped by its event loop and its bus I/O thread; N workers each have their
own, each its own bus client (node id `<node-id>-w<i>`, or a random one) and its own SO_REUSEPORT
socket on the port, so the kernel spreads connections over them. The parent serves nothing and
loads no model: it holds the port, owns the shared limits table and supervises.

Contract:
- `reserve_port(host, port) -> socket`: fails (OSError) when anything listens on host:port;
  else holds it (bound, never listening: the kernel hands connections only to listening sockets,
  and bind(0) elsewhere cannot take the port while the workers start). `--port 0` picks the port
  here, once, for every worker.
- `WorkerSeat(index, limits_fd, ready_fd)`: what a worker is given, as `--worker i,fd,fd` (both fds
  inherited; -1: none). In the worker: `seat.limiter(config)` (the shared table's limiter, or None
  when no limit is on) and `seat.announce_ready()` (once it listens).
- `worker_argv(args, config, port, seat) -> argv`: `pdbus gateway` again, with the parent's flags.
- `Backoff().after_exit(ran_s) -> delay`: FIRST_S doubling to CAP_S for a worker that keeps
  dying; one that had served STABLE_S starts again from FIRST_S.
- `WorkerPool(argv_for, num_workers, table).run(stop, started) -> exit code`: starts the workers,
  calls `started()` once all N serve (the command logs `gateway_started`), then restarts any worker
  that exits (`gateway_worker_exited`, with the delay), its in-flight counts cleared from the
  table as soon as it is seen dead. A worker that exits before all N first served ends the gateway with its exit code
  (no broker: 1; bad model or settings: 2). `stop` set (SIGINT/SIGTERM): every worker gets SIGTERM,
  SIGKILL after STOP_GRACE_S; `gateway_stopped`; exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bus.log import get_logger
from nodes.config_file import SettingsError
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.gateway.protect import Limiter
from nodes.launcher_child import die_with_parent

if TYPE_CHECKING:   # imported where a limit is on
    from nodes.gateway.shared_limits import LimitsTable

POLL_S = 0.1
STOP_GRACE_S = 4.0   # below `pdbus cluster`'s default stop_grace_s (5 s): the parent outlives its workers
log = get_logger("gateway")


def reserve_port(host: str, port: int) -> socket.socket:
    # A bind without SO_REUSEPORT fails on a port anyone listens on, SO_REUSEPORT listeners (another
    # gateway's workers) included; SO_REUSEADDR only lets it pass TIME_WAIT leftovers.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    held.bind((host, port))
    return held


@dataclass(frozen=True)
class WorkerSeat:
    index: int
    limits_fd: int = -1
    ready_fd: int = -1

    def arg(self) -> str:
        return f"{self.index},{self.limits_fd},{self.ready_fd}"

    @classmethod
    def parse(cls, text: str) -> WorkerSeat:
        try:
            index, limits_fd, ready_fd = (int(part) for part in text.split(","))
        except ValueError:
            raise SettingsError(f"--worker takes index,limits_fd,ready_fd, got {text!r}") from None
        if index < 0 or limits_fd < -1 or ready_fd < -1:
            raise SettingsError(f"--worker: impossible index or fd in {text!r}")
        return cls(index, limits_fd, ready_fd)

    def limiter(self, config: GatewayConfig) -> Limiter | None:
        if self.limits_fd < 0:
            return None
        from nodes.gateway.shared_limits import LimitsTable, SharedRateLimiter
        return SharedRateLimiter(LimitsTable.attach(self.limits_fd), self.index, config.rate_limit_rps,
                                 config.rate_limit_burst, config.max_streams_per_key)

    def announce_ready(self) -> None:
        if self.ready_fd >= 0:
            with contextlib.suppress(OSError):   # a parent gone already: nobody to tell
                os.write(self.ready_fd, b"1")
            os.close(self.ready_fd)


def worker_argv(args: argparse.Namespace, config: GatewayConfig, port: int, seat: WorkerSeat) -> list[str]:
    argv = [sys.executable, "-m", "nodes.cli", "gateway", "--worker", seat.arg(), "--host", config.host,
            "--port", str(port)]
    for flag, value in (("--config", args.config), ("--log-format", args.log_format),
                        ("--log-level", args.log_level), ("--broker", args.broker), ("--model", args.model),
                        ("--model-dir", args.model_dir), ("--model-name", args.model_name), ("--key", args.key),
                        ("--broker-timeout", args.broker_timeout)):
        if value is not None:
            argv += [flag, str(value)]
    if args.node_id:
        argv += ["--node-id", f"{args.node_id}-w{seat.index}"]
    return argv


@dataclass
class Backoff:
    FIRST_S = 0.5
    CAP_S = 30.0
    STABLE_S = 60.0
    num_failures: int = 0

    def after_exit(self, ran_s: float) -> float:
        if ran_s >= self.STABLE_S:
            self.num_failures = 0
        delay = min(self.CAP_S, self.FIRST_S * 2 ** self.num_failures)
        self.num_failures += 1
        return delay


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen | None = None
    ready_fd: int = -1          # the parent's end of the pipe, while the worker starts
    started_at: float = 0.0
    serving: bool = False
    restart_at: float | None = None
    backoff: Backoff = field(default_factory=Backoff)


class WorkerPool:
    def __init__(self, argv_for: Callable[[WorkerSeat], list[str]], num_workers: int,
                 table: LimitsTable | None = None) -> None:
        self.argv_for, self.table = argv_for, table
        self.workers = [_Worker(index) for index in range(num_workers)]
        self.announced = False

    def run(self, stop: threading.Event, started: Callable[[list[int]], None]) -> int:
        code: int | None = None
        try:
            for worker in self.workers:
                self._spawn(worker)
            while code is None and not stop.is_set():
                self._wait_ready()
                code = self._check_exits()
                if not self.announced and all(w.serving for w in self.workers):
                    self.announced = True
                    started([w.process.pid for w in self.workers if w.process is not None])
        finally:
            self._stop_all()
        return code or 0

    def _spawn(self, worker: _Worker) -> None:
        read_fd, write_fd = os.pipe()
        limits_fd = self.table.fd if self.table is not None else -1
        seat = WorkerSeat(worker.index, limits_fd, write_fd)
        fds = (write_fd, limits_fd) if limits_fd >= 0 else (write_fd,)
        try:
            # Its own process group: a terminal's Ctrl-C reaches the parent alone, which then stops
            # the workers (rather than racing to restart the ones that saw it first).
            worker.process = subprocess.Popen(self.argv_for(seat), stdin=subprocess.DEVNULL, pass_fds=fds,
                                              preexec_fn=die_with_parent, process_group=0)
        finally:
            os.close(write_fd)   # the worker's copy alone: its exit reads as EOF here
        worker.ready_fd, worker.started_at, worker.serving, worker.restart_at = read_fd, time.monotonic(), False, None

    def _wait_ready(self) -> None:
        starting = {w.ready_fd: w for w in self.workers if w.ready_fd >= 0}
        readable, _, _ = select.select(list(starting), [], [], POLL_S)
        for fd in readable:
            worker = starting[fd]
            worker.serving = os.read(fd, 1) == b"1"   # EOF: it died first (seen by _check_exits)
            os.close(fd)
            worker.ready_fd = -1

    def _check_exits(self) -> int | None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is not None:
                code = self._exited(worker, now)
                if code is not None:
                    return code
            elif worker.process is None and worker.restart_at is not None and now >= worker.restart_at:
                self._spawn(worker)
        return None

    def _exited(self, worker: _Worker, now: float) -> int | None:
        assert worker.process is not None
        returncode, pid = worker.process.returncode, worker.process.pid
        worker.process = None
        if self.table is not None:   # at once: what it held in flight died with it, and only it could release it
            self.table.clear_worker(worker.index)
        if worker.ready_fd >= 0:
            os.close(worker.ready_fd)
            worker.ready_fd = -1
        if not self.announced:   # the gateway never served: a start that fails (no broker, bad model)
            log.error("gateway_worker_failed", worker=worker.index, pid=pid, returncode=returncode)
            return returncode if returncode > 0 else 1
        delay = worker.backoff.after_exit(now - worker.started_at)
        worker.restart_at = now + delay
        log.warning("gateway_worker_exited", worker=worker.index, pid=pid, returncode=returncode,
                    restart_in_s=delay)
        return None

    def _stop_all(self) -> None:
        running = [w.process for w in self.workers if w.process is not None]
        for process in running:
            for number in (signal.SIGCONT, signal.SIGTERM):   # a stopped worker cannot act on SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(number)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        for process in running:
            if process.poll() is None:
                log.warning("gateway_worker_killed", pid=process.pid)
                process.kill()
            process.wait()
        for worker in self.workers:
            if worker.ready_fd >= 0:
                os.close(worker.ready_fd)
        log.info("gateway_stopped", returncodes=[p.returncode for p in running])
