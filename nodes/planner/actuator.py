"""How the planner's decisions reach the cluster: the `Actuator` seam, and the bus commands.

Contract (an actuator is called from a worker thread of the planner's loop, one call at a time,
so it may block; it must not raise for an ordinary refusal):
- `can_start() -> bool`: whether `start_node` can start a node now (the planner then prefers
  starting to switching; False makes it switch where it can).
- `start_node(role) -> node_id | None`: start one `prefill` or `decode` node process; its node id,
  or None when it could not (the shell logs the wish as `planner_wanted` and counts it).
- `stop_node(node_id)`: make that node leave. The default (`drain`) is a CONTROL `drain`: the node
  takes no new work, finishes or hands over its streams, then exits 0. An actuator that owns the
  process may also reclaim it once it has exited.
Role switches are not the actuator's: they are a bus command to the node itself (`switch_role`),
whoever runs the processes. `BusOnlyActuator` is the one for a planner that owns no processes
(`pdbus planner`): it cannot start nodes, and drains through the bus. The launcher's is
`nodes.planner.launcher_actuator.LauncherActuator`; a Ray one implements the same three methods.
`next_free_id(role, taken)`: the lowest stable id (`decode-2`) a started node takes, for both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol


def next_free_id(role: str, taken: Collection[str]) -> str:
    """The lowest `<role>-<n>` not in `taken`: stable ids, so the ring places sessions as before."""
    index = 0
    while f"{role}-{index}" in taken:
        index += 1
    return f"{role}-{index}"


class ControlSender(Protocol):
    """What the planner needs of its bus endpoint to command a node (`bus.endpoint.Endpoint`)."""

    def send_control(self, node_id: str, body: Mapping[str, Any]) -> None: ...


class Actuator(Protocol):
    def can_start(self) -> bool: ...

    def start_node(self, role: str) -> str | None: ...

    def stop_node(self, node_id: str) -> None: ...


def drain(control: ControlSender, node_id: str) -> None:
    """Ask a node to stop taking work, finish or hand over its streams, and exit 0."""
    control.send_control(node_id, {"action": "drain"})


def switch_role(control: ControlSender, node_id: str, role: str) -> None:
    """Ask a switchable node to drain its current role's work and re-register as `role`."""
    control.send_control(node_id, {"action": "role", "role": role})


class BusOnlyActuator:
    """Starts nothing (the shell reports each scale-up as `planner_wanted`); stops by drain."""

    def __init__(self, control: ControlSender) -> None:
        self.control = control

    def can_start(self) -> bool:
        return False

    def start_node(self, role: str) -> str | None:
        return None

    def stop_node(self, node_id: str) -> None:
        drain(self.control, node_id)
