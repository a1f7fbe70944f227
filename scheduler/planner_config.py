"""`PlannerConfig`: the `[planner]` table of the cluster config, as the planner's core reads it.

Contract: `PlannerConfig(...)` validates itself (ValueError naming the key); `from_settings(map)`
reads a `[planner]` table (ints for counts, numbers for the rest; an unknown key is an error, so
a typo never silently leaves a default in place). Defaults, and why:
- pool bounds `min_prefill` 1, `max_prefill` 4, `min_decode` 1 (a cluster needs a decode node),
  `max_decode` 4; `max_nodes` 6: the node processes the machines can hold (draining ones count
  until they exit).
- `interval_s` 5: how often the shell asks the broker (a capacity report is at most one pass old).
- `sustain_s` 30: a condition must hold this long, over snapshots at most 3 intervals apart,
  before the planner acts on it (hysteresis: a burst is not a trend).
- `cooldown_s` 60: after an action, no other for this long, and not before the action shows in
  the snapshot or `settle_timeout_s` (180: a node that never starts) has passed.
- `regret_dwell_s` 180: how long what a layout of the pools scored over its stay (the SLO credit
  of the requests that arrived in it, else the windows' attainment or worst p90 miss) is
  remembered: a role switch back into a layout left within that time is held when that layout
  missed its SLO there too and not clearly less than the present one (`held.regret`;
  `scheduler.planner_memory`). Two layouts that each make the other pool hot (a colocated pair
  whose TPOT rises under long prompts, split, then prefill hot again) otherwise flip every
  cooldown. Needs a TTFT or TPOT target (or attainment); 0 turns the memory off.
- `missing_grace_s` 60: a node that vanished unasked keeps its pool "incomplete" (no action on it)
  this long: it may be restarting.
- prefill is hot above `prefill_hot_batches` (2.0) full batches (`max_batch_tokens`, else
  `fallback_batch_tokens` 2048) of prompt tokens queued per node, or with prefill requests queued
  at the broker; cold below `prefill_cold_batches` (0.25) with none queued.
- decode is hot above `decode_hot_use` (0.85) of KV blocks or of `max_running` streams used, with
  every decode node `full`, or with decode requests queued at the broker; cold below
  `decode_cold_use` (0.30) with none queued.
- optional signals (0 = not used): `ttft_p90_target_s` (a TTFT p90 above it makes prefill hot),
  `tpot_p90_target_s` (likewise decode), `min_slo_attainment` (below it, no pool shrinks).
Cold thresholds sit well below hot ones, and a pool gives a node up only if one node smaller it
would stay under the midpoint of the two (`scheduler.planner`), so it does not flap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

COUNT_FIELDS = ("min_prefill", "max_prefill", "min_decode", "max_decode", "max_nodes", "fallback_batch_tokens")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    min_prefill: int = 1
    max_prefill: int = 4
    min_decode: int = 1
    max_decode: int = 4
    max_nodes: int = 6
    interval_s: float = 5.0
    sustain_s: float = 30.0
    cooldown_s: float = 60.0
    regret_dwell_s: float = 180.0
    settle_timeout_s: float = 180.0
    missing_grace_s: float = 60.0
    prefill_hot_batches: float = 2.0
    prefill_cold_batches: float = 0.25
    decode_hot_use: float = 0.85
    decode_cold_use: float = 0.30
    fallback_batch_tokens: int = 2048
    ttft_p90_target_s: float = 0.0
    tpot_p90_target_s: float = 0.0
    min_slo_attainment: float = 0.0

    def __post_init__(self) -> None:
        for problem in self._problems():
            raise ValueError(f"[planner] {problem}")

    def _problems(self) -> list[str]:
        problems = [f"{f.name} must be >= 0" for f in fields(self) if getattr(self, f.name) < 0]
        if not 0 <= self.min_prefill <= self.max_prefill:
            problems.append("min_prefill <= max_prefill")
        if not 1 <= self.min_decode <= self.max_decode:
            problems.append("1 <= min_decode <= max_decode (a cluster needs a decode node)")
        if self.max_nodes < self.min_prefill + self.min_decode:
            problems.append("max_nodes must hold min_prefill + min_decode")
        if self.interval_s <= 0 or self.fallback_batch_tokens <= 0:
            problems.append("interval_s and fallback_batch_tokens must be > 0")
        if not (self.prefill_cold_batches < self.prefill_hot_batches and self.decode_cold_use < self.decode_hot_use):
            problems.append("each cold threshold must be below its hot one")
        return problems

    @property
    def max_gap_s(self) -> float:
        """Snapshots further apart than this break a condition's run (the shell missed some)."""
        return 3 * self.interval_s

    def bounds(self, role: str) -> tuple[int, int]:
        return (self.min_prefill, self.max_prefill) if role == "prefill" else (self.min_decode, self.max_decode)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> PlannerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"[planner] unknown keys: {', '.join(unknown)}")
        chosen: dict[str, Any] = {name: _read(name, value) for name, value in values.items()}
        return cls(**chosen)


def _read(name: str, value: object) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"[planner] {name} must be a number, got {value!r}")
    if name in COUNT_FIELDS:
        if not isinstance(value, int):
            raise ValueError(f"[planner] {name} must be a whole number, got {value!r}")
        return value
    return float(value)
