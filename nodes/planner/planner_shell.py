"""The planner's shell: every interval, the broker's stats -> the core (`scheduler.planner`) -> an
action through the bus or the actuator, each decision logged with its reasons.

Contract:
- `PlannerShell(planner, endpoint, actuator, dry_run=False, stats_timeout_s=2.0, clock=monotonic,
  signals=None)`. `endpoint` is a registered `control` bus endpoint (`request(...)` for the
  broker's stats, `send_control(...)`, `registered`; tests pass a fake). `signals` (optional) is a
  callable returning `Signals` (SLO attainment, TTFT/TPOT p90) each tick, called on a worker
  thread after the broker answered (it may block on I/O, e.g. `slo_signals.SloSignals`' scrape).
- `await tick() -> list[Decision]`: one round. No answer from the broker (not registered, timeout,
  error) -> nothing decided (`no_stats`, log `planner_no_stats`). Each decision is logged as
  `planner_decision` (kind, role, node_id, reason, dry_run) and carried out: `switch_role` ->
  CONTROL `{"action": "role", "role"}` to the node, `scale_down` -> `actuator.stop_node`,
  `scale_up` -> `actuator.start_node` (None: logged `planner_wanted`, counted `wanted.<role>`).
  A switch the core holds for regret (`planner.held_back`) is logged `planner_held` (kind, role,
  node_id, reason) when the holding starts, not every round. With `dry_run` nothing is carried
  out and the core waits out its cooldown only. An action that raises is logged
  `planner_action_failed` and counted (`failed_actions.<kind>`); the loop goes on.
- `await run(stop)`: `tick()` every `config.interval_s` until `stop` is set; a bug in one tick is
  logged (`planner_tick_failed`) and never ends the loop.
- `counts`: the shell's Counter (`no_stats`, `wanted.<role>`, `failed_actions.<kind>`), exported
  with the core's by `planner_metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from bus.constants import BROKER_STATS_SERVICE
from bus.log import get_logger
from bus.mailbox import answer_map
from nodes.planner.actuator import Actuator, ControlSender, switch_role
from scheduler.planner import Decision, DecisionKind, Planner
from scheduler.planner_signals import Signals, parse_snapshot


class ControlEndpoint(ControlSender, Protocol):
    """The part of `bus.endpoint.Endpoint` the shell uses."""

    @property
    def registered(self) -> bool: ...

    def request(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
                request_id: str | None = None, timeout: float | None = None) -> Any: ...


class PlannerShell:
    def __init__(self, planner: Planner, endpoint: ControlEndpoint, actuator: Actuator, *, dry_run: bool = False,
                 stats_timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 signals: Callable[[], Signals] | None = None) -> None:
        self.planner, self.endpoint, self.actuator = planner, endpoint, actuator
        self.dry_run, self.stats_timeout_s, self.clock = dry_run, stats_timeout_s, clock
        self.signals = signals or Signals
        self.counts: Counter[str] = Counter()
        self.log = get_logger("planner", dry_run=dry_run)
        self._held: tuple[str, str, str | None] | None = None   # the switch being held back, if any

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.planner.config.interval_s
        while not stop.is_set():
            started = self.clock()
            try:
                await self.tick()
            except Exception:   # one bad tick must not end the planner: log it, try again next interval
                self.log.exception("planner_tick_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (self.clock() - started)))

    async def tick(self) -> list[Decision]:
        body = await self.fetch_stats()
        if body is None:
            self.counts["no_stats"] += 1
            self.log.warning("planner_no_stats", registered=self.endpoint.registered)
            return []
        snapshot = parse_snapshot(body, await asyncio.to_thread(self.signals))
        can_start = await asyncio.to_thread(self.actuator.can_start)
        held_before = self._held
        decisions = self.planner.decide(snapshot, self.clock(), can_start)
        self._log_held(held_before)
        for decision in decisions:
            await self._act(decision)
        return decisions

    def _log_held(self, before: tuple[str, str, str | None] | None) -> None:
        """Log a switch held for regret once, when the planner starts holding it."""
        held = self.planner.held_back
        self._held = None if held is None else (str(held.kind), held.role, held.node_id)
        if held is not None and self._held != before:
            self.log.info("planner_held", kind=str(held.kind), role=held.role, node_id=held.node_id, reason=held.reason)

    async def fetch_stats(self) -> dict | None:
        """The broker's stats body, or None when it does not answer in time."""
        if not self.endpoint.registered:
            return None
        return await answer_map(self.endpoint.request(BROKER_STATS_SERVICE, {}, timeout=self.stats_timeout_s))

    # -- carrying a decision out ---------------------------------------------------------

    async def _act(self, decision: Decision) -> None:
        self.log.info("planner_decision", kind=str(decision.kind), role=decision.role, node_id=decision.node_id,
                      reason=decision.reason)
        if self.dry_run:
            self.planner.not_carried_out()
            return
        try:
            await self._carry_out(decision)
        except Exception as exc:   # an actuator or bus refusal costs this action, never the planner
            self.counts[f"failed_actions.{decision.kind}"] += 1
            self.planner.not_carried_out()
            self.log.warning("planner_action_failed", kind=str(decision.kind), role=decision.role,
                             node_id=decision.node_id, error=f"{type(exc).__name__}: {exc}")

    async def _carry_out(self, decision: Decision) -> None:
        if decision.kind is DecisionKind.SWITCH_ROLE:
            switch_role(self.endpoint, _node(decision), decision.role)
        elif decision.kind is DecisionKind.SCALE_DOWN:
            await asyncio.to_thread(self.actuator.stop_node, _node(decision))
        else:
            await self._start(decision)

    async def _start(self, decision: Decision) -> None:
        node_id = await asyncio.to_thread(self.actuator.start_node, decision.role)
        if node_id is None:
            self.counts[f"wanted.{decision.role}"] += 1
            self.planner.not_carried_out()
            self.log.info("planner_wanted", kind=str(decision.kind), role=decision.role, reason=decision.reason)
            return
        self.planner.started(node_id)
        self.log.info("planner_node_started", role=decision.role, node_id=node_id)


def _node(decision: Decision) -> str:
    if decision.node_id is None:
        raise ValueError(f"a {decision.kind} decision names no node")
    return decision.node_id
