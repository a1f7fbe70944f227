"""The launcher's actuator: the next free stable id, a node started on the supervisor's thread,
drains by CONTROL; and the supervisor taking a node's exit 0 as a drain, not a failure."""

from __future__ import annotations

import queue
import sys
import threading

from structlog.testing import capture_logs

from nodes.launch_plan import ChildSpec, ClusterShape
from nodes.launcher import Supervisor
from nodes.planner.actuator import next_free_id
from nodes.planner.launcher_actuator import LauncherActuator
from tests.nodes.planner.planner_fakes import FakeEndpoint


class FakeSupervisor:
    """Runs `call_soon` calls on a thread of its own, like the supervisor's loop (or never)."""

    def __init__(self, alive: set[str], runs_calls: bool = True) -> None:
        self.alive, self.spawned = alive, []
        self.calls: queue.Queue = queue.Queue()
        if runs_calls:
            threading.Thread(target=self._run_calls, daemon=True).start()

    def _run_calls(self) -> None:
        while True:
            self.calls.get()()

    def call_soon(self, call) -> None:
        self.calls.put(call)

    def spawn_node(self, spec: ChildSpec) -> None:
        self.spawned.append(spec)
        self.alive.add(spec.name)

    def live_names(self) -> set[str]:
        return set(self.alive)


def test_the_next_free_id_is_the_lowest_no_live_child_holds():
    assert next_free_id("decode", set()) == "decode-0"
    assert next_free_id("decode", {"decode-0", "decode-2", "prefill-1"}) == "decode-1"
    assert next_free_id("prefill", {"prefill-0", "prefill-1"}) == "prefill-2"


def test_start_node_starts_a_stable_id_with_the_clusters_arguments():
    supervisor = FakeSupervisor({"broker", "prefill-0", "decode-0"})
    actuator = LauncherActuator(supervisor, FakeEndpoint([{}]), ClusterShape(model="tiny"), ("--config", "c.toml"))
    assert actuator.can_start()
    assert actuator.start_node("decode") == "decode-1"
    assert actuator.start_node("prefill") == "prefill-1"
    spec = supervisor.spawned[0]
    assert spec.name == "decode-1" and not spec.is_broker
    argv = " ".join(spec.argv)
    assert "nodes.cli decode --model tiny --node-id decode-1 --config c.toml" in argv


def test_a_supervisor_that_does_not_get_to_it_starts_nothing():
    actuator = LauncherActuator(FakeSupervisor(set(), runs_calls=False), FakeEndpoint([{}]), ClusterShape(),
                                start_timeout_s=0.05)
    assert actuator.start_node("decode") is None


def test_stop_node_drains_by_control():
    endpoint = FakeEndpoint([{}])
    LauncherActuator(FakeSupervisor(set()), endpoint, ClusterShape()).stop_node("decode-3")
    assert endpoint.controls == [("decode-3", {"action": "drain"})]


def _exited_child(supervisor: Supervisor, name: str, code: int):
    spec = ChildSpec(name, (sys.executable, "-c", f"raise SystemExit({code})"))
    supervisor.plan.append(spec)
    child = supervisor._spawn(spec, spec.argv)
    child.process.wait(10)
    return child


def test_a_node_exiting_0_was_drained_and_one_exiting_otherwise_failed():
    supervisor = Supervisor([ChildSpec("broker", ("true",), is_broker=True)])
    with capture_logs() as events:
        drained, failed = _exited_child(supervisor, "decode-1", 0), _exited_child(supervisor, "decode-2", 3)
        supervisor._report_exit(drained)
        supervisor._report_exit(failed)
    names = [(e["event"], e.get("child")) for e in events if e["event"].startswith("cluster_")]
    assert ("cluster_node_drained", "decode-1") in names and ("cluster_child_exited", "decode-2") in names
    assert [s.name for s in supervisor.plan] == ["broker", "decode-2"]   # readiness no longer waits for it
    assert supervisor.live_names() == set()
