"""`LayoutMemory`: how well each layout of the pools served, so that the planner switches a node
back into a layout it left recently only when that layout served clearly better (its rule 7).

Contract (plain data; `now` comes in):
- A *layout* is `(prefill, decode, colocated)`: the non-draining nodes of each role
  (`layout_of(snapshot)`; `after_switch(layout, from_role, to_role)` is the layout a switch makes).
- `score(signals, config) -> float | None`: how well the cluster serves now, higher is better: the
  SLO attainment when known; else 1 / the worst miss (the larger of TTFT p90 / its target and TPOT
  p90 / its target; 1.0 on target), capped at 1; None with neither (no target or no signal).
- `observe(layout, score, now)`: one settled snapshot's score in that layout. The planner calls it
  only once `cooldown_s` has passed since its last action, so the signals' window shows the
  layout. Each layout keeps the mean score of its *latest stay* (entering a layout again starts a
  new mean) and when it was last observed.
- `holds_back(current, destination, now) -> bool`: a switch back into a layout observed within
  `dwell_s` is held back unless that layout's stay scored better than the present stay so far by
  more than `MARGIN` of it. A layout not observed within `dwell_s`, or a present stay with no score
  yet: not held (nothing to go by: the switch is tried, and so learnt).

Why: past its capacity a two-node cluster misses in both layouts (split: TTFT; colocated: TPOT),
each layout makes the other pool look hot, and the planner flipped every cooldown (14 switches in
a run of 12-05), each switch costing a drain. A layout is left when it does worst (its queues at
their longest), so only what it did over a whole stay says which one serves better; without
clear evidence for the other, staying put is the cheaper choice. After `dwell_s` the evidence is
stale (the traffic may have changed) and the switch is tried again.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import Signals, Snapshot

Layout = tuple[int, int, int]
LAYOUT_ROLES = ("prefill", "decode", "both")
MARGIN = 0.1   # a layout left recently is returned to only if it scored better than this fraction more


def layout_of(snapshot: Snapshot) -> Layout:
    counts = [sum(1 for n in snapshot.of_role(role) if not n.draining) for role in LAYOUT_ROLES]
    return counts[0], counts[1], counts[2]


def after_switch(layout: Layout, from_role: str, to_role: str) -> Layout:
    counts = list(layout)
    counts[LAYOUT_ROLES.index(from_role)] -= 1
    counts[LAYOUT_ROLES.index(to_role)] += 1
    return counts[0], counts[1], counts[2]


def worst_miss(signals: Signals, config: PlannerConfig) -> float | None:
    """The larger of TTFT p90 / its target and TPOT p90 / its target (1.0: on target); None
    without a target and its signal."""
    misses = [p90 / target for p90, target in ((signals.ttft_p90_s, config.ttft_p90_target_s),
                                               (signals.tpot_p90_s, config.tpot_p90_target_s))
              if target > 0 and p90 is not None]
    return max(misses) if misses else None


def score(signals: Signals, config: PlannerConfig) -> float | None:
    if signals.slo_attainment is not None:
        return signals.slo_attainment
    miss = worst_miss(signals, config)
    if miss is None:
        return None
    return 1.0 if miss <= 1.0 else 1.0 / miss


@dataclass(slots=True)
class _Stay:
    total: float
    count: int
    seen_at: float

    @property
    def mean(self) -> float:
        return self.total / self.count


class LayoutMemory:
    def __init__(self, dwell_s: float) -> None:
        self.dwell_s = dwell_s
        self._stays: dict[Layout, _Stay] = {}
        self._current: Layout | None = None

    def observe(self, layout: Layout, value: float | None, now: float) -> None:
        if value is None:
            return
        stay = self._stays.get(layout)
        if stay is None or layout != self._current:
            self._stays[layout] = _Stay(value, 1, now)   # a new stay: what the layout did before is stale
        else:
            stay.total += value
            stay.count += 1
            stay.seen_at = now
        self._current = layout

    def holds_back(self, current: Layout, destination: Layout, now: float) -> bool:
        here, there = self._stays.get(current), self._stays.get(destination)
        if here is None or there is None or current != self._current or now - there.seen_at > self.dwell_s:
            return False
        return there.mean <= here.mean * (1 + MARGIN)

    def means(self) -> dict[Layout, float]:
        return {layout: stay.mean for layout, stay in self._stays.items()}
