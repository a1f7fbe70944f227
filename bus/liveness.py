"""Heartbeat settings, per-link liveness timers and reconnect back-off; pure, clock passed in.

Contract (both sides of every link, after 6/PPP): any message received counts as life
(`heard`); a HEARTBEAT is due only when nothing was sent for one interval (`heartbeat_due`);
a peer silent for `interval * liveness` is dead (`is_expired`).
Engaged and idle links (docs/PROTOCOL.md §1.4): a link that carries a request (either end serves
or awaits one) keeps `interval`; a serving node's link with no request uses `idle_interval`
(both the heartbeat period and, times `liveness`, the window). `LinkTimers.engage(engaged, now)`
records when a link became engaged: an engaged link's window counts from the later of the last
message and that moment, so a peer that was heartbeating slowly is never judged by the short
window for silence from before it had work. `Backoff` gives the delay before the next reconnect
attempt: one interval, doubling, capped, with jitter in [d/2, d] so a fleet of nodes does not
reconnect in lock-step after a broker restart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from bus import constants as c


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    interval_s: float = c.DEFAULT_HEARTBEAT_INTERVAL_S
    liveness: int = c.DEFAULT_LIVENESS
    backoff_cap_s: float = c.DEFAULT_BACKOFF_CAP_S
    idle_interval_s: float = 0.0   # 0: the larger of `interval_s` and the 1 s default

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.liveness < 1:
            raise ValueError("heartbeat interval must be > 0 and liveness >= 1")
        if self.idle_interval_s == 0.0:
            object.__setattr__(self, "idle_interval_s", max(self.interval_s, c.DEFAULT_IDLE_HEARTBEAT_INTERVAL_S))
        if not self.interval_s <= self.idle_interval_s <= c.MAX_IDLE_HEARTBEAT_INTERVAL_S:
            raise ValueError(f"heartbeat idle interval must lie in [interval, "
                             f"{c.MAX_IDLE_HEARTBEAT_INTERVAL_S:g} s]")

    @property
    def expiry_s(self) -> float:
        """Silence after which a peer with work is declared dead."""
        return self.interval_s * self.liveness

    @property
    def idle_expiry_s(self) -> float:
        """Silence after which a serving node's idle link is declared dead."""
        return self.idle_interval_s * self.liveness

    @property
    def tick_s(self) -> float:
        """How often shells run the timers: detection lands within expiry + tick."""
        return self.interval_s / 5

    @classmethod
    def from_settings(cls, heartbeat: dict[str, Any]) -> HeartbeatConfig:
        """From a `[heartbeat]` table: interval_ms, liveness, backoff_cap_ms, idle_interval_ms
        (default: the larger of the interval and 1 s)."""
        interval_ms = float(heartbeat.get("interval_ms", c.DEFAULT_HEARTBEAT_INTERVAL_S * 1000))
        cap_ms = heartbeat.get("backoff_cap_ms", c.DEFAULT_BACKOFF_CAP_S * 1000)
        idle_ms = heartbeat.get("idle_interval_ms", 0.0)
        return cls(interval_s=interval_ms / 1000,
                   liveness=int(heartbeat.get("liveness", c.DEFAULT_LIVENESS)),
                   backoff_cap_s=float(cap_ms) / 1000, idle_interval_s=float(idle_ms) / 1000)


@dataclass(slots=True)
class LinkTimers:
    """When we last heard from and last sent to one peer, and since when it carries work
    (None: idle; links that are never idle keep the default `0.0`)."""

    last_seen: float
    last_sent: float
    engaged_at: float | None = 0.0

    def heard(self, now: float) -> None:
        self.last_seen = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    def engage(self, engaged: bool, now: float) -> None:
        """Record whether the link carries work now (called at each timer run)."""
        if not engaged:
            self.engaged_at = None
        elif self.engaged_at is None:
            self.engaged_at = now

    def is_expired(self, now: float, config: HeartbeatConfig) -> bool:
        if self.engaged_at is None:
            return now - self.last_seen > config.idle_expiry_s
        return now - max(self.last_seen, self.engaged_at) > config.expiry_s

    def heartbeat_due(self, now: float, config: HeartbeatConfig) -> bool:
        interval = config.interval_s if self.engaged_at is not None else config.idle_interval_s
        return now - self.last_sent >= interval


class Backoff:
    """Exponential back-off with jitter; `reset()` after a successful registration."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.num_attempts = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.num_attempts, 30)))
        self.num_attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.num_attempts = 0
