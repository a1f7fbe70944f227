"""The planner inside `pdbus cluster --planner`: an actuator whose nodes are the launcher's children.

Contract:
- `LauncherActuator(supervisor, control, shape, common)`: `can_start()` is True; `start_node(role)`
  starts `pdbus prefill|decode --node-id <role>-<N>` (the lowest N no live child holds, so ids stay
  stable: `next_free_id`) on the supervisor's thread and returns the id (None if the supervisor
  did not get to it within `start_timeout_s`, e.g. while it stops); `stop_node(node_id)` sends the
  CONTROL drain: the node exits 0 and the launcher logs `cluster_node_drained`, not a failure.
- `LauncherPlanner(settings, options, shape, common, dry_run)`: the supervisor's companion: on
  `start(supervisor)` a `PlannerThread` registers as `planner` (role `control`) with the cluster's
  brokers and runs the planner with a `LauncherActuator`; `stop()` ends it before the nodes stop.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from bus.endpoint import Endpoint
from bus.log import get_logger
from nodes.launch_plan import ClusterShape, node_spec
from nodes.launcher import Supervisor
from nodes.planner.actuator import ControlSender, drain, next_free_id
from nodes.planner.planner_run import PlannerOptions, PlannerThread, control_endpoint
from nodes.planner.planner_shell import PlannerShell
from scheduler.planner import Planner

log = get_logger("planner")


class LauncherActuator:
    def __init__(self, supervisor: Supervisor, control: ControlSender, shape: ClusterShape,
                 common: tuple[str, ...] = (), start_timeout_s: float = 5.0) -> None:
        self.supervisor, self.control, self.shape, self.common = supervisor, control, shape, common
        self.start_timeout_s = start_timeout_s

    def can_start(self) -> bool:
        return True

    def start_node(self, role: str) -> str | None:
        started: Future[str] = Future()

        def spawn() -> None:   # on the supervisor's thread: it alone reads and changes the children
            node_id = next_free_id(role, self.supervisor.live_names())
            self.supervisor.spawn_node(node_spec(role, node_id, self.shape, self.common))
            started.set_result(node_id)

        self.supervisor.call_soon(spawn)
        try:
            return started.result(self.start_timeout_s)
        except FutureTimeout:
            return None

    def stop_node(self, node_id: str) -> None:
        drain(self.control, node_id)


class LauncherPlanner:
    def __init__(self, settings: dict, options: PlannerOptions, shape: ClusterShape,
                 common: tuple[str, ...] = (), dry_run: bool = False) -> None:
        self.settings, self.options, self.shape, self.common = settings, options, shape, common
        self.dry_run = dry_run
        self.thread: PlannerThread | None = None

    def start(self, supervisor: Supervisor) -> None:
        def make_shell(endpoint: Endpoint) -> PlannerShell:
            actuator = LauncherActuator(supervisor, endpoint, self.shape, self.common)
            return PlannerShell(Planner(self.options.config), endpoint, actuator, dry_run=self.dry_run,
                                stats_timeout_s=self.options.stats_timeout_s)

        self.thread = PlannerThread(self.options, lambda broker: control_endpoint(self.settings, broker), make_shell)
        self.thread.start(supervisor.broker_endpoint or "")

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.stop()
