"""`LayoutMemory`: how well each layout of the pools served, so that the planner switches a node
back into a layout it left recently only when that layout served clearly better (its rule 7).

Contract (plain data; `now` comes in):
- A *layout* is `(prefill, decode, colocated)`: the non-draining nodes of each role
  (`layout_of(snapshot)`; `after_switch(layout, from_role, to_role)` is the layout a switch makes).
- `score(signals, config) -> float | None`: how well the cluster serves now, higher is better: the
  SLO attainment when known; else 1 / the worst miss (the larger of TTFT p90 / its target and TPOT
  p90 / its target; 1.0 on target), capped at 1; None with neither (no target or no signal).
- `observe(layout, score, now, arrivals=None)`: one settled snapshot in that layout: its score and
  the SLO outcomes by second of arrival (`Signals.arrivals`, the latest word on each second). The
  planner calls it only once `cooldown_s` has passed since its last action. Each layout keeps its
  *latest stay* (entering a layout again starts a new one): when it began, when it was left
  (`left(now)`, which the planner calls when it acts; else when another layout is observed) and
  last observed, and the mean of its snapshots' scores.
- A stay's score is the mean SLO credit of the requests that *arrived* during it (from its start
  to its leaving or now) whose outcome is known, when at least `MIN_JUDGED` are (`ArrivalCount`:
  1 for a request within its SLO, else the share of the targets it met, so that past capacity,
  where hardly a request meets its SLO in either layout, the one nearer its targets still shows).
  Only while no signals have carried arrivals (a gateway without them) is it the mean of its
  snapshots' scores (windows of requests that *ended* lately, which after a switch still hold the
  previous layout's queue).
- `scores(current, destination, now) -> (here, there, basis) | None`, and `regrets(scores)` /
  `holds_back(current, destination, now) -> bool` on them: a switch back into a layout observed
  within `dwell_s` is held back unless that layout's stay missed less than the present stay so
  far by more than `MARGIN` of the present misses (a miss is 1 - the
  score: a ratio of scores near 1 would call 0.98 against 0.89 a tie), or unless it scored at least
  `SERVED_WELL` (it met the SLO there: the memory damps flips between layouts that both miss, past
  capacity, not moves between layouts that serve). Both stays are judged by their arrivals when
  both can be (basis "arrivals"); by their snapshots ("windows") only while no signals have
  carried arrivals. A layout not observed within `dwell_s`, or stays with nothing to judge by (too
  few known arrivals yet): not held (the switch is tried, and so learnt).

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
from scheduler.planner_signals import ArrivalCount, Signals, Snapshot

Layout = tuple[int, int, int]
LAYOUT_ROLES = ("prefill", "decode", "both")
MARGIN = 0.1   # a layout left recently is returned to only if it missed this fraction less
MIN_JUDGED = 8   # requests of known outcome that a stay's arrivals need to score it
SERVED_WELL = 0.9   # a layout that scored this much is returned to freely: it met the SLO there


def regrets(scores: tuple[float, float, str]) -> bool:
    """Whether `scores` (from `LayoutMemory.scores`) hold the switch back."""
    if scores[1] >= SERVED_WELL:   # it met the SLO there: nothing to regret
        return False
    return 1.0 - scores[1] >= (1.0 - scores[0]) * (1 - MARGIN)


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
    started_at: float
    seen_at: float
    total: float = 0.0
    count: int = 0
    left_at: float | None = None

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


class LayoutMemory:
    def __init__(self, dwell_s: float) -> None:
        self.dwell_s = dwell_s
        self._stays: dict[Layout, _Stay] = {}
        self._current: Layout | None = None
        self._outcomes: dict[float, tuple[int, float]] = {}   # second of arrival -> (judged, credit)
        self._by_arrival = False   # the signals have carried arrivals: the windows are not used

    def observe(self, layout: Layout, value: float | None, now: float,
                arrivals: tuple[ArrivalCount, ...] | None = None) -> None:
        if arrivals is not None:
            self._by_arrival = True
        for count in arrivals or ():
            self._outcomes[count.at] = (count.within + count.missed, count.credit)   # the latest word on it
        self._forget_outcomes(now)
        if value is None and not arrivals:
            return
        stay = self._stays.get(layout)
        if stay is None or layout != self._current:
            self.left(now)
            stay = self._stays[layout] = _Stay(started_at=now, seen_at=now)   # what it did before is stale
        if value is not None:
            stay.total += value
            stay.count += 1
        stay.seen_at = now
        self._current = layout

    def left(self, now: float) -> None:
        """The planner switched a node: the present stay ends now (the switch's own seconds are
        judged as neither layout's)."""
        stay = self._stays.get(self._current) if self._current is not None else None
        if stay is not None and stay.left_at is None:
            stay.left_at = now

    def holds_back(self, current: Layout, destination: Layout, now: float) -> bool:
        scores = self.scores(current, destination, now)
        return scores is not None and regrets(scores)

    def scores(self, current: Layout, destination: Layout, now: float) -> tuple[float, float, str] | None:
        """(present stay's score, the destination's latest stay's, what they were judged by) when a
        switch into `destination` is to be weighed; None when there is nothing to go by."""
        here, there = self._stays.get(current), self._stays.get(destination)
        if here is None or there is None or current != self._current or now - there.seen_at > self.dwell_s:
            return None
        here_arrivals, there_arrivals = self._arrival_score(here, now), self._arrival_score(there, now)
        if here_arrivals is not None and there_arrivals is not None:
            return here_arrivals, there_arrivals, "arrivals"
        if self._by_arrival:   # too few known yet: the windows would judge the previous layout's queue
            return None
        if here.mean is not None and there.mean is not None:
            return here.mean, there.mean, "windows"
        return None

    def means(self) -> dict[Layout, float]:
        return {layout: stay.mean for layout, stay in self._stays.items() if stay.mean is not None}

    def _arrival_score(self, stay: _Stay, now: float) -> float | None:
        """The mean SLO credit of the requests that arrived during the stay and whose outcome is
        known; None with fewer than MIN_JUDGED of them."""
        end = stay.left_at if stay.left_at is not None else now
        judged, credit = 0, 0.0
        for at, (n, c) in self._outcomes.items():
            if stay.started_at <= at < end:
                judged, credit = judged + n, credit + c
        return credit / judged if judged >= MIN_JUDGED else None

    def _forget_outcomes(self, now: float) -> None:
        oldest = min((stay.started_at for stay in self._stays.values() if now - stay.seen_at <= self.dwell_s),
                     default=now)
        for at in [at for at in self._outcomes if at < oldest - 1]:
            del self._outcomes[at]
