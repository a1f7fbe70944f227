"""`Planner`: sizes the prefill and decode pools from what the cluster reports, within bounds,
with hysteresis. Plain data: no sockets, no clock (`now` comes in), no logging (the shell,
`nodes/planner/`, logs and carries out what it returns).

Contract:
- `Planner(config)`; `decide(snapshot, now, can_start=True) -> list[Decision]` (empty, or one:
  never two actions at once). `snapshot` is `planner_signals.parse_snapshot(...)`; `can_start`
  says whether the actuator can start a node now. The decision is taken as carried out; the
  shell calls `started(node_id)` when a scale-up got a node id, or `not_carried_out()` when the
  action did not happen (then only the cooldown holds).
- `Decision(kind, role, node_id, reason)`: `scale_up` (role: the pool; node_id None), `scale_down`
  (the node to drain), `switch_role` (node_id moves to `role`). `reason` says why, in words.
- `held_back`: the switch the last `decide` would have made but held for regret (rule 7), its
  reason naming both layouts' scores; None otherwise (the shell logs each new one).
- `metrics` (a Counter): `decisions.<kind>.<role>`, `held.<why>` (each snapshot that ended in no
  action, by its reason: `steady`, `waiting`, `cooldown`, `saturated`, `no_room.<role>`,
  `incomplete.<role>`, `not_cool.<role>`, `slo_missed`, `regret`, `bad_snapshot`),
  `regrets.<role>` (switches into <role> held for regret), `snapshots`, `malformed_nodes`,
  `settled`, `settle_timeout`. `gauges() -> dict[str, float]`: the last snapshot's pressures and pool sizes.

Rules, in order, each on the pools' *sustained* states (a pool is below its min, above its max,
hot or cold once that condition, see `planner_config`, has held for `sustain_s` over snapshots at
most 3 intervals apart):
1. Wait: after an action, nothing until `cooldown_s` has passed and the action shows in the
   snapshot (the new node registered, the drained node gone, the switched node back in its new
   role, not draining) or `settle_timeout_s` passed (`held.waiting`, `held.cooldown`). Condition
   runs restart after the wait: the load before the action says nothing about the load after it.
2. A pool is *incomplete* while the broker counts more nodes of its role than it sent reports for
   (a report skipped as malformed, a listing cut at 1,024 nodes), or while a node seen in it in
   the last `missing_grace_s` is gone without having been seen draining and without the planner
   having drained it (mid-restart, or lost). No action takes a node from, adds one to, or counts
   on an incomplete pool (`held.incomplete.<role>`).
3. A pool below its min (or above its max) for `sustain_s` (a node may be starting) is brought
   back: scale up as in rule 5 (scale down its idlest node).
4. Both pools hot: scale up the hotter (load / its hot threshold) if its max and `max_nodes`
   allow (else the other, if its own do); else, when one of them has no node at all (its work
   falls back onto the other: decode nodes prefill locally), switch a node of the other into it
   if that pool stays at or above its min; else nothing (`held.saturated`).
5. One pool hot: scale it up if its bounds and `max_nodes` allow and `can_start`; else switch the
   least-loaded switchable, non-draining node of the other pool, if that pool stays at or above
   its min and cool enough (below); else scale up anyway when only `can_start` was missing (the
   shell reports it as wanted); else nothing (`held.no_room.<role>`).
5b. Prefill hot with no room to add a prefill node and none to switch in: where `min_prefill` is
   0 and decode is not hot, switch a prefill node to decode (`_colocate`): decode nodes prefill
   their own prompts when no prefill node is left, so every core prefills. An empty prefill pool
   is refilled only when decode runs hot too (rule 4), so the two moves do not undo each other.
6. A pool cold and the other not hot: scale down the pool's idlest node if it is above its min
   and the SLO attainment (when known and targeted) is not below `min_slo_attainment`.
7. Regret (flap damping): a role switch back into a layout (`planner_memory`) observed within the
   last `regret_dwell_s` is held (`held.regret`, `regrets.<role>`) when that layout's stay scored
   below 0.9 and did not miss (1 - its score) a tenth less than the present stay so far. A stay
   scores the mean SLO credit of the requests that arrived during it, else (a gateway without
   arrivals) the attainment of the windows observed in it.
Cool enough to give a node up (rules 5 and 6): nothing of its service queued at the broker and,
one node smaller, its pressure would stay below the midpoint of its cold and hot thresholds.
Draining nodes are never capacity, never chosen, and count towards `max_nodes` until they leave.
Colocated (`both`) nodes are in neither pool but count towards `max_nodes`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from scheduler.planner_config import PlannerConfig
from scheduler.planner_memory import LayoutMemory, after_switch, layout_of, regrets, score
from scheduler.planner_rules import Decision, DecisionKind, PoolView, choose
from scheduler.planner_signals import POOL_ROLES, PoolLoad, Snapshot, pool_load

__all__ = ["Decision", "DecisionKind", "Planner", "PlannerConfig"]


@dataclass(frozen=True, slots=True)
class _Seen:
    role: str
    at: float
    draining: bool


@dataclass(slots=True)
class _Pending:
    decision: Decision
    at: float
    size_before: int
    node_id: str | None   # the node it concerns (for a scale-up: once the shell names it)


class Planner:
    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.config = config or PlannerConfig()
        self.metrics: Counter[str] = Counter()
        self._since: dict[str, float] = {}      # "decode.hot" -> when it began to hold
        self._last_at: float | None = None
        self._seen: dict[str, _Seen] = {}       # every node of the last snapshots, as last seen
        self._gone_by_us: set[str] = set()      # nodes the planner drained: their leaving is expected
        self._pending: _Pending | None = None
        self._acted_at: float | None = None
        self._memory = LayoutMemory(self.config.regret_dwell_s)
        self.held_back: Decision | None = None
        self._gauges: dict[str, float] = {}

    # -- the shell's side ----------------------------------------------------------------

    def decide(self, snapshot: Snapshot, now: float, can_start: bool = True) -> list[Decision]:
        self.metrics["snapshots"] += 1
        self.held_back = None
        self.metrics["malformed_nodes"] += snapshot.num_malformed
        if not snapshot.valid:
            return self._hold("bad_snapshot")
        view = self._observe(snapshot, now)
        if self._waiting(snapshot, now):
            return []
        self._memory.observe(layout_of(snapshot), score(snapshot.signals, self.config), now,
                             snapshot.signals.arrivals)
        outcome = choose(view, self.config, can_start)
        if isinstance(outcome, str):
            return self._hold(outcome)
        if (regret := self._regretted(outcome, snapshot, now)) is not None:
            self.metrics[f"regrets.{outcome.role}"] += 1
            self.held_back = dataclasses.replace(outcome, reason=f"{outcome.reason}; held: {regret}")
            return self._hold("regret")
        self._commit(outcome, view, now)
        return [outcome]

    def started(self, node_id: str) -> None:
        """The node a scale-up started: the planner waits for that one to register."""
        if self._pending is not None and self._pending.decision.kind is DecisionKind.SCALE_UP:
            self._pending.node_id = node_id

    def not_carried_out(self) -> None:
        """The last decision did not happen: wait out the cooldown only, expect nothing."""
        if self._pending is not None and self._pending.decision.kind is DecisionKind.SCALE_DOWN:
            self._gone_by_us.discard(self._pending.node_id or "")
        self._pending = None

    def gauges(self) -> dict[str, float]:
        return dict(self._gauges)

    # -- what the snapshot says ----------------------------------------------------------

    def _observe(self, snapshot: Snapshot, now: float) -> PoolView:
        if self._last_at is not None and now - self._last_at > self.config.max_gap_s:
            self._since.clear()
        self._last_at = now
        pools = {role: pool_load(snapshot, role, self.config.fallback_batch_tokens) for role in POOL_ROLES}
        states, why = {}, {}
        for role, pool in pools.items():
            states[role], why[role] = self._sustained(pool, snapshot, now)
        view = PoolView(pools, states, why, self._incomplete(snapshot, now), len(snapshot.nodes),
                        snapshot.signals.slo_attainment)
        self._gauges = _gauges_of(view, snapshot)
        return view

    def _sustained(self, pool: PoolLoad, snapshot: Snapshot, now: float) -> tuple[str, str]:
        """The pool's first condition that has held for `sustain_s` (bounds first), and why."""
        low, high = self.config.bounds(pool.role)
        hot = self._hot(pool, snapshot)
        conditions = {"below_min": f"{pool.size} nodes < {low}" if pool.size < low else None,
                      "above_max": f"{pool.size} nodes > {high}" if pool.size > high else None,
                      "hot": hot, "cold": None if hot else self._cold(pool, snapshot)}
        held, why = "", ""
        for name, reason in conditions.items():
            key = f"{pool.role}.{name}"
            if reason is None:
                self._since.pop(key, None)
                continue
            since = self._since.setdefault(key, now)
            if not held and now - since >= self.config.sustain_s:
                held = name
                why = f"{pool.role} {name.replace('_', ' ')} for {now - since:.0f}s ({reason})"
        return (held, why) if held else ("", f"{pool.role} steady (pressure {pool.pressure:.2f})")

    def _hot(self, pool: PoolLoad, snapshot: Snapshot) -> str | None:
        if pool.queued > 0:
            return f"{pool.queued} {pool.role} requests queued at the broker"
        if pool.pressure > self._hot_threshold(pool.role):
            return f"pressure {pool.pressure:.2f} > {self._hot_threshold(pool.role)}"
        if pool.role == "decode" and pool.active and all(n.get("full") > 0 for n in pool.active):
            return "every decode node full"
        return self._over_target(pool.role, snapshot)

    def _cold(self, pool: PoolLoad, snapshot: Snapshot) -> str | None:
        cold = self._cold_threshold(pool.role)
        if pool.queued or pool.pressure >= cold or self._over_target(pool.role, snapshot):
            return None
        return f"pressure {pool.pressure:.2f} < {cold}"

    def _over_target(self, role: str, snapshot: Snapshot) -> str | None:
        config, signals = self.config, snapshot.signals
        value, target, name = ((signals.ttft_p90_s, config.ttft_p90_target_s, "TTFT") if role == "prefill"
                               else (signals.tpot_p90_s, config.tpot_p90_target_s, "TPOT"))
        if target > 0 and value is not None and value > target:
            return f"{name} p90 {value:.3f}s > {target}s"
        return None

    def _hot_threshold(self, role: str) -> float:
        return self.config.prefill_hot_batches if role == "prefill" else self.config.decode_hot_use

    def _cold_threshold(self, role: str) -> float:
        return self.config.prefill_cold_batches if role == "prefill" else self.config.decode_cold_use

    def _incomplete(self, snapshot: Snapshot, now: float) -> frozenset[str]:
        """Roles with nodes the snapshot should have and does not (module docstring, rule 2)."""
        roles = {role for role in POOL_ROLES if snapshot.nodes_by_role.get(role, 0) != len(snapshot.of_role(role))}
        present = {n.node_id for n in snapshot.nodes}
        pending = self._pending.node_id if self._pending else None
        for node_id, seen in list(self._seen.items()):
            if node_id in present or node_id == pending:
                continue
            if seen.draining or node_id in self._gone_by_us or now - seen.at > self.config.missing_grace_s:
                del self._seen[node_id]
                self._gone_by_us.discard(node_id)
            else:
                roles.add(seen.role)
        self._seen.update({n.node_id: _Seen(n.role, now, n.draining) for n in snapshot.nodes})
        return frozenset(roles)

    # -- waiting after an action ---------------------------------------------------------

    def _waiting(self, snapshot: Snapshot, now: float) -> bool:
        if self._pending is not None and not self._settled(self._pending, snapshot, now):
            self._since.clear()
            self._hold("waiting")
            return True
        if self._acted_at is not None and now - self._acted_at < self.config.cooldown_s:
            self._since.clear()
            self._hold("cooldown")
            return True
        return False

    def _settled(self, pending: _Pending, snapshot: Snapshot, now: float) -> bool:
        if self._shows(pending, snapshot):
            self.metrics["settled"] += 1
        elif now - pending.at >= self.config.settle_timeout_s:
            self.metrics["settle_timeout"] += 1
        else:
            return False
        self._pending = None
        return True

    def _shows(self, pending: _Pending, snapshot: Snapshot) -> bool:
        decision, node = pending.decision, snapshot.node(pending.node_id or "")
        if decision.kind is DecisionKind.SCALE_DOWN:
            return node is None
        if decision.kind is DecisionKind.SWITCH_ROLE:
            return node is not None and node.role == decision.role and not node.draining
        if pending.node_id is not None:
            return node is not None and not node.draining
        return pool_load(snapshot, decision.role, 1).size > pending.size_before

    def _regretted(self, decision: Decision, snapshot: Snapshot, now: float) -> str | None:
        """Why the switch is held (rule 7), or None."""
        node = snapshot.node(decision.node_id or "")
        if decision.kind is not DecisionKind.SWITCH_ROLE or node is None:
            return None
        here = layout_of(snapshot)
        there = after_switch(here, node.role, decision.role)
        scores = self._memory.scores(here, there, now)
        if scores is None or not regrets(scores):
            return None
        scored_here, scored_there, basis = scores
        return (f"layout {there} (prefill, decode, colocated), left within {self.config.regret_dwell_s:.0f}s, "
                f"scored {scored_there:.2f} over its stay, {here} {scored_here:.2f} so far (by {basis})")

    def _commit(self, decision: Decision, view: PoolView, now: float) -> None:
        self.metrics[f"decisions.{decision.kind}.{decision.role}"] += 1
        size_before = view.pools[decision.role].size
        self._pending = _Pending(decision, now, size_before, decision.node_id)
        if decision.kind is DecisionKind.SCALE_DOWN and decision.node_id:
            self._gone_by_us.add(decision.node_id)
        self._acted_at = now
        self._since.clear()
        self._memory.left(now)

    def _hold(self, why: str) -> list[Decision]:
        self.metrics[f"held.{why}"] += 1
        return []


def _gauges_of(view: PoolView, snapshot: Snapshot) -> dict[str, float]:
    gauges: dict[str, float] = {"serving_nodes": view.num_nodes,
                                "draining_nodes": sum(n.draining for n in snapshot.nodes)}
    for role, pool in view.pools.items():
        gauges.update({f"{role}_pressure": pool.pressure, f"{role}_nodes": pool.size,
                       f"{role}_queued": pool.queued, f"{role}_hot": float(view.states[role] == "hot"),
                       f"{role}_cold": float(view.states[role] == "cold")})
    return gauges
