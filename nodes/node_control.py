"""What a node loop does with its `Lifecycle` (nodes/node_lifecycle.py): CONTROL commands, SIGTERM,
the request gate, hand-overs, role switches and the exit.

Contract: `NodeControl(endpoint, works, lifecycle)`; the loop calls `offer(message, now) -> bool`
before its works (True: handled here: a `Control`, or a REQUEST refused with ERROR `draining`),
`turn(now) -> bool` once per turn (True: the node should stop: drained), `terminate()` from the
SIGTERM handler (thread-safe: a flag read at the next turn), `active(work) -> bool` (its
capacity is reported: it serves the current role) and `capacity()` (the lifecycle's keys).
Works may provide `service` (the one they serve), `num_in_flight()` and `hand_over(reason)`;
one without them counts as idle. Every decision is logged with the CONTROL's sender:
`control_accepted`, `control_refused` (also counted, `counters["control.refused"]`),
`drain_started`, `drain_handed_over`, `role_switched`, `drained`.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from bus import constants as c
from bus.log import get_logger
from bus.messages import Control, Request
from nodes import wire
from nodes.node_lifecycle import Action, Lifecycle

HAND_OVER_REASON = "the node is draining: resume on another node"


class NodeControl:
    def __init__(self, endpoint: Any, works: list[Any], lifecycle: Lifecycle) -> None:
        self.endpoint, self.works, self.lifecycle = endpoint, works, lifecycle
        self.counters: Counter[str] = Counter()
        self.log = get_logger("node", node_id=endpoint.node_id)
        self._terminate = False
        self.publish_now = lambda: None   # set by the loop: send CAPACITY now

    # -- inputs ----------------------------------------------------------------------------
    def terminate(self) -> None:
        self._terminate = True

    def offer(self, message: Any, now: float) -> bool:
        if isinstance(message, Control):
            self._on_control(message, now)
            return True
        if isinstance(message, Request) and self._refuses(message.service):
            self.counters["request.draining"] += 1
            self.endpoint.reply_error(message.request_id, wire.Code.DRAINING, HAND_OVER_REASON,
                                      node_id=self.endpoint.node_id)
            return True
        return False

    def _refuses(self, service: str) -> bool:
        """A request this node could serve, but not now (draining, or routed before a switch)."""
        could = self.lifecycle.draining or self.lifecycle.switchable
        return could and service in c.SERVICES_BY_ROLE["both"] and not self.lifecycle.accepts(service)

    def _on_control(self, message: Control, now: float) -> None:
        try:
            body = wire.from_wire(wire.ControlBody, message.body)
            refusal = self.lifecycle.on_control(body, now)
        except wire.Refused as exc:
            self.counters["control.refused"] += 1
            self.log.warning("control_refused", reason=exc.reason, sender=message.peer)
            return
        fields = {"sender": message.peer, "action": body.action, "role": body.role}
        if refusal is not None:
            self.counters["control.refused"] += 1
            self.log.warning("control_refused", reason=refusal, **fields)
            return
        self.log.info("control_accepted", phase=self.lifecycle.phase, **fields)
        self.publish_now()   # `draining` reaches the policy before the next request does

    # -- each turn ---------------------------------------------------------------------------
    def turn(self, now: float) -> bool:
        if self._terminate:
            self._terminate = False
            if self.lifecycle.on_terminate(now):
                return True
            self.log.info("drain_started", why="SIGTERM", timeout_s=self.lifecycle.drain_timeout_s)
            self.publish_now()
        if not self.lifecycle.draining:
            return False
        action = self.lifecycle.next_action(now, self.num_in_flight())
        if action is Action.HAND_OVER:
            self._hand_over()
            action = self.lifecycle.next_action(now, self.num_in_flight())
        if action is Action.SWITCH:
            self._switch()
        if action is Action.EXIT:
            self.log.info("drained", phase=self.lifecycle.phase)
        return action is Action.EXIT

    def num_in_flight(self) -> int:
        return sum(work.num_in_flight() for work in self.works if hasattr(work, "num_in_flight"))

    def _hand_over(self) -> None:
        handed = sum(work.hand_over(HAND_OVER_REASON) for work in self.works if hasattr(work, "hand_over"))
        self.publish_now()   # the KV the handed-over requests held is free
        self.log.warning("drain_handed_over", num_requests=handed, timeout_s=self.lifecycle.drain_timeout_s)

    def _switch(self) -> None:
        started = time.monotonic()
        self.endpoint.change_role(self.lifecycle.role)
        self.publish_now()
        self.log.info("role_switched", role=self.lifecycle.role, num_switches=self.lifecycle.num_switches,
                      ms=round((time.monotonic() - started) * 1000, 2))

    # -- capacity ----------------------------------------------------------------------------
    def active(self, work: Any) -> bool:
        service = getattr(work, "service", None)
        return service is None or service in c.SERVICES_BY_ROLE[self.lifecycle.role]

    def capacity(self) -> dict[str, float]:
        return self.lifecycle.capacity()
