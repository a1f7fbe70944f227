"""A node's lifecycle, sans I/O: serving, draining to leave, draining to switch role
(docs/CLUSTER.md "Drains and role switches").

Contract: `Lifecycle(role, switchable, drain_timeout_s)`; inputs `on_control(body, now) -> refusal
| None` (a `wire.ControlBody` from a `control` peer), `on_terminate(now) -> bool` (SIGTERM: drain
and exit; True when it was already draining: stop now); then, once per loop turn,
`next_action(now, num_in_flight) -> Action`, which the node loop carries out:
- `Action.NONE`: keep serving what it serves;
- `Action.HAND_OVER`: the drain deadline passed with requests still in flight: end each with ERROR
  `draining` (its client resumes it on another node, exactly as after a node loss), then call
  `next_action` again;
- `Action.SWITCH`: nothing is in flight: register again as `role` (already updated) and serve it;
- `Action.EXIT`: nothing is in flight: leave (DISCONNECT, exit code 0).
`accepts(service) -> bool`: whether a new request for `service` is taken now (False while
draining: the node answers ERROR `draining`, the client goes elsewhere at once). `draining` is in
the node's capacity while it drains (`scheduler.node_loads.is_draining`: the policy routes
nothing new there and its sessions move by the ring). A `drain` overrides a pending switch; a
second switch while one drains retargets it (back to the current role: the switch is called off
and the node serves on); a switch to the role it serves, or on a node that is not switchable,
is refused with a reason (logged and counted by the caller).
"""

from __future__ import annotations

from enum import StrEnum

from bus import constants as c
from nodes import wire


class Phase(StrEnum):
    SERVING = "serving"
    DRAINING = "draining"     # then exit
    SWITCHING = "switching"   # then serve `target_role`


class Action(StrEnum):
    NONE = "none"
    HAND_OVER = "hand_over"
    SWITCH = "switch"
    EXIT = "exit"


class Lifecycle:
    def __init__(self, role: str, *, switchable: bool = False, drain_timeout_s: float = 30.0) -> None:
        self.role, self.switchable, self.drain_timeout_s = role, switchable, drain_timeout_s
        self.phase = Phase.SERVING
        self.target_role = role
        self.deadline: float | None = None
        self.num_switches = 0

    @property
    def draining(self) -> bool:
        return self.phase is not Phase.SERVING

    def accepts(self, service: str) -> bool:
        return not self.draining and service in c.SERVICES_BY_ROLE[self.role]

    def on_control(self, body: wire.ControlBody, now: float) -> str | None:
        """Start what `body` asks; a reason when it is refused."""
        if body.action == "drain":
            self._drain(Phase.DRAINING, now)
            return None
        if not self.switchable:
            return "this node cannot switch role (start it with --switchable)"
        if self.phase is Phase.DRAINING:
            return "the node is draining to leave"
        if body.role == self.role:
            if self.phase is Phase.SERVING:
                return f"the node already serves {body.role}"
            self.phase, self.target_role, self.deadline = Phase.SERVING, self.role, None   # called off
            return None
        self.target_role = body.role
        self._drain(Phase.SWITCHING, now)
        return None

    def on_terminate(self, now: float) -> bool:
        """SIGTERM: drain, then exit. True when already draining to leave: stop at once."""
        if self.phase is Phase.DRAINING:
            return True
        self._drain(Phase.DRAINING, now)
        return False

    def _drain(self, phase: Phase, now: float) -> None:
        if self.deadline is None:
            self.deadline = now + self.drain_timeout_s
        self.phase = phase

    def next_action(self, now: float, num_in_flight: int) -> Action:
        if not self.draining:
            return Action.NONE
        if num_in_flight:
            return Action.HAND_OVER if self.deadline is not None and now >= self.deadline else Action.NONE
        if self.phase is Phase.DRAINING:
            return Action.EXIT
        self.role, self.phase, self.deadline = self.target_role, Phase.SERVING, None
        self.num_switches += 1
        return Action.SWITCH

    def capacity(self) -> dict[str, float]:
        """What the node adds to its capacity report."""
        report: dict[str, float] = {"draining": int(self.draining)} if self.draining else {}
        if self.switchable:
            report |= {"switchable": 1, "role_switches": self.num_switches}
        return report
