"""The planner's `Actuator` (nodes/planner/actuator.py) on Ray, and `pdbus ray up --planner`.

Contract (called from the planner's worker thread, one call at a time; Ray connected):
- `RayActuator(namespace, record)` — `record` is the pool's (`placement.load_record`);
  `RayActuator.from_cluster(namespace)` reads it, None when no pool is up.
- `can_start() -> bool`: the cluster has the CPUs, GPUs and custom resources a node asks for
  free now (else its actor would wait unplaced, and the planner should switch a role instead).
- `start_node(role) -> node_id | None`: a new node actor `prefill-N` / `decode-N` (the lowest N
  no live component holds, so ids stay stable), placed like the pool's others; None when the
  role is not prefill/decode or nothing can be placed. It joins the ring once it registers.
- `stop_node(node_id)`: SIGTERM to that node's process: it drains and exits 0, and its actor
  stays down; `reap()` (run by every call) kills the actors of nodes that exited 0.
- `run_planner(settings, actuator, brokers, stop)`: the planner's loop (`nodes.planner`) on a
  thread of this process, as a `control` peer of the brokers, until `stop` is set.
"""

from __future__ import annotations

import threading

import ray

from nodes.launch_plan import ClusterShape
from nodes.planner.actuator import next_free_id
from nodes.ray_pools import placement
from nodes.ray_pools.pool_plan import NODE_KINDS, RayOptions, kind_of, node_component

STARTABLE_ROLES = ("prefill", "decode")


class RayActuator:
    def __init__(self, namespace: str, record: dict) -> None:
        self.namespace, self.config_text = namespace, record["config_text"]
        shape = dict(record["shape"])
        self.shape = ClusterShape(**{**shape, "node_args": ()})   # the options' node_args are added again
        self.addresses = [(str(name), str(address)) for name, address in record["addresses"]]
        options = dict(record["options"])
        self.options = RayOptions(**{**options, "node_args": tuple(options.get("node_args", ()))})
        self.log_level, self.env = record.get("log_level"), dict(record.get("env", {}))

    @classmethod
    def from_cluster(cls, namespace: str) -> RayActuator | None:
        record = placement.load_record(namespace)
        return cls(namespace, record) if record else None

    def can_start(self) -> bool:
        self.reap()
        free = ray.available_resources()
        asks = {"CPU": self.options.node_cpus, "GPU": self.options.node_gpus, **self.options.node_resources}
        return all(free.get(name, 0.0) >= amount for name, amount in asks.items() if amount > 0)

    def start_node(self, role: str) -> str | None:
        if role not in STARTABLE_ROLES or not self.can_start():
            return None
        node_id = next_free_id(role, placement.components())
        spec = node_component(role, node_id, self.shape, self.addresses, self.options, self.log_level, self.env)
        placement.launch(spec, self.config_text, self.namespace)
        return node_id

    def stop_node(self, node_id: str) -> None:
        self.reap()
        handle = placement.components().get(node_id)
        if handle is not None and kind_of(node_id) in NODE_KINDS:
            placement.call(handle, "drain")

    def reap(self) -> list[str]:
        """Kill the actors of nodes whose process exited 0 (drained): they never come back."""
        reaped = []
        for name, handle in placement.components().items():
            if kind_of(name) not in NODE_KINDS:
                continue
            info = placement.call(handle, "info")
            if info is not None and info["state"] == "exited":
                placement.call(handle, "close")
                placement.kill(handle)
                reaped.append(name)
        return reaped


def run_planner(settings: dict, actuator: RayActuator, brokers: str, stop: threading.Event) -> None:
    from bus.endpoint import Endpoint
    from nodes.planner.planner_run import PlannerThread, control_endpoint, planner_options
    from nodes.planner.planner_shell import PlannerShell
    from scheduler.planner import Planner

    options = planner_options(settings)

    def make_shell(endpoint: Endpoint) -> PlannerShell:
        return PlannerShell(Planner(options.config), endpoint, actuator, stats_timeout_s=options.stats_timeout_s)

    thread = PlannerThread(options, lambda broker: control_endpoint(settings, broker), make_shell)
    thread.start(brokers)
    try:
        stop.wait()
    finally:
        thread.stop()
