"""The planner's rules on one view of the pools: which single action, if any, and why.

Contract: `choose(view, config, can_start) -> Decision | str`: a `Decision`, or the reason the
planner holds (`steady`, `saturated`, `no_room.<role>`, `incomplete.<role>`, `slo_missed`,
`not_cool.<role>`). Pure: the view carries the *sustained* states (`scheduler.planner` keeps the
hysteresis, the waiting after an action and the pools' completeness). The rules, in order, are
those of `scheduler.planner`'s docstring, rules 3 to 6.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import POOL_ROLES, PoolLoad, node_load


class DecisionKind(StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SWITCH_ROLE = "switch_role"


@dataclass(frozen=True, slots=True)
class Decision:
    kind: DecisionKind
    role: str               # the pool that grows or shrinks; for a switch, the node's new role
    node_id: str | None     # the node to drain or switch; None for a scale-up
    reason: str


@dataclass(frozen=True, slots=True)
class PoolView:
    pools: Mapping[str, PoolLoad]
    states: Mapping[str, str]      # role -> "below_min", "above_max", "hot", "cold" or "" (sustained)
    why: Mapping[str, str]         # role -> what made its state, in words
    incomplete: frozenset[str]
    num_nodes: int                 # serving node processes, draining and colocated ones included
    slo_attainment: float | None = None


def other_role(role: str) -> str:
    return "decode" if role == "prefill" else "prefill"


def choose(view: PoolView, config: PlannerConfig, can_start: bool) -> Decision | str:
    rules = _Rules(view, config, can_start)
    return rules.restore_bounds() or rules.grow() or rules.shrink() or "steady"


class _Rules:
    def __init__(self, view: PoolView, config: PlannerConfig, can_start: bool) -> None:
        self.view, self.config, self.can_start = view, config, can_start

    # -- rule 3: bounds ------------------------------------------------------------------

    def restore_bounds(self) -> Decision | str | None:
        for role in POOL_ROLES:
            if self.view.states[role] == "below_min":
                return self._add(role, self.view.why[role])
            if self.view.states[role] == "above_max":
                return self._remove(role, self.view.why[role], cool_check=False)
        return None

    # -- rules 4 and 5: a hot pool -------------------------------------------------------

    def grow(self) -> Decision | str | None:
        hot = sorted((r for r in POOL_ROLES if self.view.states[r] == "hot"), key=self._heat, reverse=True)
        if len(hot) == 1:
            return self._add(hot[0], self.view.why[hot[0]])
        why = f"{self.view.why['prefill']}; {self.view.why['decode']}"
        for role in hot:   # both: the hotter first; a switch would only move the heat...
            if role not in self.view.incomplete and self._has_room(role):
                return self._scale_up(role, f"both pools hot, {role} the hotter or the one with room: {why}")
        for role in hot:   # ...unless a pool is empty: the other does its work too, and badly
            if self.view.pools[role].size == 0 and (switch := self._switch_into(role, why, require_cool=False)):
                return switch
        return "saturated" if hot else None

    def _heat(self, role: str) -> tuple[float, bool]:
        pool = self.view.pools[role]
        hot = self.config.prefill_hot_batches if role == "prefill" else self.config.decode_hot_use
        return max(pool.pressure / hot, 1.0 if pool.queued else 0.0), role == "decode"

    def _add(self, role: str, why: str) -> Decision | str:
        if role in self.view.incomplete:
            return f"incomplete.{role}"
        if self._has_room(role) and self.can_start:
            return self._scale_up(role, why)
        # An empty prefill pool's work is done where it decodes (local prefills): refilling it
        # takes decode running hot too (rule 4), else the planner would undo `_colocate`.
        switch = None if self._prefill_done_locally(role) else self._switch_into(role, why)
        if switch is not None:
            return switch
        if self._has_room(role):   # only starting was missing: the shell reports what it wanted
            return self._scale_up(role, f"{why}; no node can start now and none can switch")
        return self._colocate(role, why) or f"no_room.{role}"

    def _prefill_done_locally(self, role: str) -> bool:
        return role == "prefill" and self.view.pools["prefill"].size == 0

    def _colocate(self, role: str, why: str) -> Decision | None:
        """Prefill hot, no room for another prefill node: where `min_prefill` is 0 and decode is
        not hot, a prefill node becomes a decode node that prefills its own prompts, so every
        core prefills (what colocated nodes do; on a small machine often the better split)."""
        decode = self.view.pools["decode"]
        prefill = [n for n in self.view.pools["prefill"].active if n.switchable]
        if (role != "prefill" or self.config.min_prefill > 0 or not prefill or self.view.states["decode"] == "hot"
                or decode.size >= self.config.bounds("decode")[1] or {"prefill", "decode"} & self.view.incomplete):
            return None
        node = min(prefill, key=node_load)
        return Decision(DecisionKind.SWITCH_ROLE, "decode", node.node_id,
                        f"{why}; no room for another prefill node: {node.node_id} decodes and prefills its own "
                        f"prompts (min_prefill 0, decode not hot), so every core prefills")

    def _has_room(self, role: str) -> bool:
        _, high = self.config.bounds(role)
        return self.view.pools[role].size < high and self.view.num_nodes < self.config.max_nodes

    def _scale_up(self, role: str, why: str) -> Decision:
        _, high = self.config.bounds(role)
        room = f"{role} {self.view.pools[role].size}/{high}, nodes {self.view.num_nodes}/{self.config.max_nodes}"
        return Decision(DecisionKind.SCALE_UP, role, None, f"{why}; {room}")

    def _switch_into(self, role: str, why: str, require_cool: bool = True) -> Decision | None:
        donor = other_role(role)
        pool = self.view.pools[donor]
        low, _ = self.config.bounds(donor)
        _, high = self.config.bounds(role)
        if (donor in self.view.incomplete or self.view.pools[role].size >= high or pool.size <= low
                or (require_cool and not self._cool_enough(pool))):
            return None
        candidates = [n for n in pool.active if n.switchable]
        if not candidates:
            return None
        node = min(candidates, key=node_load)
        return Decision(DecisionKind.SWITCH_ROLE, role, node.node_id,
                        f"{why}; no room to start a {role} node, {node.node_id} is the least-loaded "
                        f"switchable {donor} node ({donor} pressure {pool.pressure:.2f}, {pool.size} nodes)")

    # -- rule 6: a cold pool -------------------------------------------------------------

    def shrink(self) -> Decision | str | None:
        cold = sorted((r for r in POOL_ROLES if self.view.states[r] == "cold"), key=self._heat)
        for role in cold:
            if self.view.pools[role].size > self.config.bounds(role)[0]:
                return self._remove(role, self.view.why[role], cool_check=True)
        return None

    def _remove(self, role: str, why: str, cool_check: bool) -> Decision | str:
        pool = self.view.pools[role]
        if role in self.view.incomplete:
            return f"incomplete.{role}"
        target, attainment = self.config.min_slo_attainment, self.view.slo_attainment
        if cool_check and target > 0 and attainment is not None and attainment < target:
            return "slo_missed"
        if cool_check and not self._cool_enough(pool):
            return f"not_cool.{role}"
        node = min(pool.active, key=node_load)
        low, _ = self.config.bounds(role)
        return Decision(DecisionKind.SCALE_DOWN, role, node.node_id,
                        f"{why}; {node.node_id} is the idlest of {pool.size} {role} nodes (min {low})")

    def _cool_enough(self, pool: PoolLoad) -> bool:
        """Nothing queued, and one node smaller the pool stays below the midpoint of its thresholds."""
        config = self.config
        hot, cold = ((config.prefill_hot_batches, config.prefill_cold_batches) if pool.role == "prefill"
                     else (config.decode_hot_use, config.decode_cold_use))
        remaining = pool.size - 1
        projected = pool.pressure * pool.size / remaining if remaining else (math.inf if pool.pressure else 0.0)
        return pool.queued == 0 and projected < (hot + cold) / 2
