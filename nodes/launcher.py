"""Run a whole local cluster as child processes: one broker, then the nodes, in the foreground.

Contract:
- The plan (what to start, in order; pure): `nodes/launch_plan.py`.
- With `num_brokers` k > 1 the plan starts `broker-0`..`broker-<k-1>` on consecutive ports and
  every node gets all their endpoints; a broker that dies is started again on its address while
  the others serve (with one broker, its death ends the cluster). Readiness is read from the
  first broker's log.
- `Supervisor(plan).run(stop) -> exit code`: starts the broker, learns the endpoint it bound
  from its `broker_started` log event (so `tcp://host:0` works), starts the nodes pointing at it,
  logs `cluster_broker_ready`, `cluster_node_ready` (the broker's `node_joined` for that node)
  and `cluster_ready` once every node has registered. A node that exits is reported
  (`cluster_child_exited`) and the rest keep serving; a broker that exits ends the cluster with
  exit code 1. A node that exits 0 was drained (it leaves only when asked): `cluster_node_drained`,
  and the cluster's readiness no longer waits for it. `stop` set (SIGINT/SIGTERM in `pdbus
  cluster`) -> nodes get SIGTERM, then the broker, and whatever is still alive after `grace_s` gets
  SIGKILL; exit code 0.
- A `companion` (`pdbus cluster --planner`'s planner) starts once the nodes registered (or
  `start_timeout_s` passed) and stops before they do; it adds nodes with `call_soon(lambda: spawn_node(node_spec(...)))` (the supervisor's
  thread owns the children; `live_names()` are those alive).
- Children log JSON on stderr; the supervisor parses every line and re-renders it (console
  format in a terminal, JSON otherwise) tagged with the child's name. Each child runs in its
  own process group, so a terminal's Ctrl-C reaches only the supervisor, which then stops the
  nodes before the broker; and each gets PR_SET_PDEATHSIG, so even a SIGKILLed launcher leaves
  no orphans behind (`nodes.launcher_child`: `Child`, `die_with_parent`, which the gateway's own workers use too).
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from bus.log import get_logger
from nodes.launch_plan import ChildSpec
from nodes.launcher_child import Child, parse_line

_POLL_S = 0.1


class Companion(Protocol):
    def start(self, supervisor: Supervisor) -> None: ...

    def stop(self) -> None: ...


class Supervisor:
    def __init__(self, plan: list[ChildSpec], *, grace_s: float = 5.0, start_timeout_s: float = 30.0,
                 json_output: bool = False, companion: Companion | None = None) -> None:
        self.plan, self.grace_s, self.start_timeout_s = plan, grace_s, start_timeout_s
        self.json_output, self.companion = json_output, companion
        self._calls: queue.Queue[Callable[[], None]] = queue.Queue()
        self._companion_started = False
        self.children: list[Child] = []
        self.broker_endpoint: str | None = None   # every broker's, comma-separated, once all are up
        self.bound: dict[str, str] = {}           # broker name -> the endpoint it bound
        self.ready: set[str] = set()
        self.log = get_logger("cluster")
        self._lines: queue.Queue = queue.Queue()
        self._console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        self._started_at = time.monotonic()

    # -- the foreground loop -------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        broker_specs = [spec for spec in self.plan if spec.is_broker]
        brokers = [self._spawn(spec, spec.argv) for spec in broker_specs]
        code = self._wait_for_brokers(brokers, stop)
        if code is None:
            self.broker_endpoint = ",".join(self.bound[spec.name] for spec in broker_specs)
            self.log.info("cluster_broker_ready", endpoint=self.broker_endpoint)
            for spec in self.plan:
                if not spec.is_broker:
                    self._spawn(spec, (*spec.argv, "--broker", self.broker_endpoint))
            code = self._serve(brokers, stop)
        if self._companion_started and self.companion is not None:
            self.companion.stop()
        self.stop_all()
        return code

    def _wait_for_brokers(self, brokers: list[Child], stop: threading.Event) -> int | None:
        deadline = time.monotonic() + self.start_timeout_s
        while len(self.bound) < len(brokers):
            if stop.is_set():
                return 0
            broker = next((b for b in brokers if not b.alive()), None) or brokers[0]
            if not broker.alive() or time.monotonic() > deadline:
                self._drain()
                self.log.error("cluster_broker_failed", returncode=broker.process.poll(),
                               waited_s=round(time.monotonic() - self._started_at, 1))
                return 1
            self._drain(_POLL_S)
        return None

    def _serve(self, brokers: list[Child], stop: threading.Event) -> int:
        """Until `stop`. One broker dying ends the cluster (exit 1); one of several is started
        again on its address while the others serve (docs/CLUSTER.md "Several brokers")."""
        while not stop.is_set():
            self._drain(_POLL_S)
            self._companion_turn()
            for child in self.children:
                if not child.alive() and not child.reported_exit:
                    self._report_exit(child)
            for index, broker in enumerate(brokers):
                if broker.alive():
                    continue
                self.log.error("cluster_broker_died", child=broker.spec.name, returncode=broker.process.returncode)
                if len(brokers) == 1:
                    return 1
                argv = _with_endpoint(broker.spec.argv, self.bound[broker.spec.name])
                brokers[index] = self._spawn(broker.spec, argv)
        return 0

    # -- children ------------------------------------------------------------------------

    def _spawn(self, spec: ChildSpec, argv: tuple[str, ...]) -> Child:
        child = Child(spec, argv, self._lines)
        self.children.append(child)
        self.log.info("cluster_child_started", child=spec.name, pid=child.pid)
        return child

    def _companion_turn(self) -> None:
        """Start the companion once every node registered (or start_timeout_s passed: a node that
        never comes must not keep the planner away); run what it asked for."""
        ready = self.ready == self._node_names() or time.monotonic() - self._started_at > self.start_timeout_s
        if self.companion is not None and not self._companion_started and ready:
            self._companion_started = True
            self.companion.start(self)
        while not self._calls.empty():
            self._calls.get_nowait()()

    def call_soon(self, call: Callable[[], None]) -> None:
        """Run `call` on the supervisor's thread (from any thread), within one poll interval."""
        self._calls.put(call)

    def spawn_node(self, spec: ChildSpec) -> None:
        """Start one more node while the cluster serves (on the supervisor's thread)."""
        self.plan.append(spec)
        self._spawn(spec, (*spec.argv, "--broker", self.broker_endpoint or ""))

    def live_names(self) -> set[str]:
        return {c.spec.name for c in self.children if c.alive()}

    def _report_exit(self, child: Child) -> None:
        child.reported_exit = True
        self.ready.discard(child.spec.name)
        if child.process.returncode == 0 and not child.spec.is_broker:
            self.plan = [spec for spec in self.plan if spec is not child.spec]
            self.log.info("cluster_node_drained", child=child.spec.name, pid=child.pid)
            return
        self.log.warning("cluster_child_exited", child=child.spec.name, pid=child.pid,
                         returncode=child.process.returncode)

    def stop_all(self) -> None:
        """SIGTERM the nodes, then the broker (so nodes can say DISCONNECT); SIGKILL stragglers."""
        nodes = [c for c in self.children if not c.spec.is_broker]
        brokers = [c for c in self.children if c.spec.is_broker]
        for group in (nodes, brokers):
            for child in group:
                child.signal(signal.SIGCONT)   # a stopped child cannot act on SIGTERM
                child.signal(signal.SIGTERM)
            self._wait_exit(group, self.grace_s)
        for child in self.children:
            if child.alive():
                self.log.warning("cluster_child_killed", child=child.spec.name, pid=child.pid)
                child.signal(signal.SIGKILL)
            child.process.wait()
            child.finish_reading()
        self._drain()
        self.log.info("cluster_stopped", returncodes={c.spec.name: c.process.returncode for c in self.children})

    def _wait_exit(self, children: list[Child], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(c.alive() for c in children) and time.monotonic() < deadline:
            self._drain(0.05)

    # -- child output --------------------------------------------------------------------

    def _drain(self, timeout: float = 0.0) -> None:
        """Forward every waiting child line; wait up to `timeout` for the first one."""
        try:
            first = self._lines.get(timeout=timeout) if timeout else self._lines.get_nowait()
        except queue.Empty:
            return
        self._forward(*first)
        while True:
            try:
                self._forward(*self._lines.get_nowait())
            except queue.Empty:
                return

    def _forward(self, child: Child, line: str) -> None:
        event = parse_line(line)
        if event is None:
            print(f"[{child.spec.name}] {line}", file=sys.stderr, flush=True)
            return
        event.setdefault("child", child.spec.name)
        if self.json_output:
            print(json.dumps(event), file=sys.stderr, flush=True)
        else:
            print(self._console(None, event.get("level", "info"), dict(event)), file=sys.stderr, flush=True)
        if child.spec.is_broker:
            self._on_broker_event(child, event)

    def _on_broker_event(self, child: Child, event: dict) -> None:
        name = event.get("event")
        if name == "broker_started" and child.spec.name not in self.bound:
            self.bound[child.spec.name] = event["endpoint"]
        elif name == "node_joined" and event.get("node_id") in self._node_names() and child is self._first_broker():
            self.ready.add(event["node_id"])
            self.log.info("cluster_node_ready", node_id=event["node_id"], role=event.get("role"),
                          num_ready=len(self.ready), num_nodes=len(self._node_names()))
            if self.ready == self._node_names():
                self.log.info("cluster_ready", endpoint=self.broker_endpoint, num_nodes=len(self.ready),
                              elapsed_s=round(time.monotonic() - self._started_at, 2))
        elif name == "node_left" and event.get("node_id") in self._node_names() and child is self._first_broker():
            self.ready.discard(event["node_id"])

    def _first_broker(self) -> Child | None:
        return next((c for c in reversed(self.children) if c.spec is self.plan[0]), None)

    def _node_names(self) -> set[str]:
        return {node_id for spec in self.plan if not spec.is_broker for node_id in spec.bus_ids or (spec.name,)}


def _with_endpoint(argv: tuple[str, ...], endpoint: str) -> tuple[str, ...]:
    """A broker's argv binding `endpoint` (the address it bound the first time: port 0 resolved)."""
    at = argv.index("--endpoint")
    return (*argv[:at + 1], endpoint, *argv[at + 2:])
