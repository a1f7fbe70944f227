"""Heartbeat settings, per-link liveness timers and reconnect back-off; pure, clock passed in.

Contract (both sides of every link, after 6/PPP): any message received counts as life
(`heard`); a HEARTBEAT is due only when nothing was sent for one interval (`heartbeat_due`);
a peer silent for `interval * liveness` is dead (`is_expired`). `Backoff` gives the delay
before the next reconnect attempt: one interval, doubling, capped, with jitter in [d/2, d] so
a fleet of nodes does not reconnect in lock-step after a broker restart.
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

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.liveness < 1:
            raise ValueError("heartbeat interval must be > 0 and liveness >= 1")

    @property
    def expiry_s(self) -> float:
        """Silence after which a peer is declared dead."""
        return self.interval_s * self.liveness

    @property
    def tick_s(self) -> float:
        """How often shells run the timers: detection lands within expiry + tick."""
        return self.interval_s / 5

    @classmethod
    def from_settings(cls, heartbeat: dict[str, Any]) -> HeartbeatConfig:
        """From a `[heartbeat]` table: interval_ms, liveness, backoff_cap_ms."""
        interval_ms = heartbeat.get("interval_ms", c.DEFAULT_HEARTBEAT_INTERVAL_S * 1000)
        cap_ms = heartbeat.get("backoff_cap_ms", c.DEFAULT_BACKOFF_CAP_S * 1000)
        return cls(interval_s=float(interval_ms) / 1000,
                   liveness=int(heartbeat.get("liveness", c.DEFAULT_LIVENESS)),
                   backoff_cap_s=float(cap_ms) / 1000)


@dataclass(slots=True)
class LinkTimers:
    """When we last heard from and last sent to one peer."""

    last_seen: float
    last_sent: float

    def heard(self, now: float) -> None:
        self.last_seen = now

    def sent(self, now: float) -> None:
        self.last_sent = now

    def is_expired(self, now: float, config: HeartbeatConfig) -> bool:
        return now - self.last_seen > config.expiry_s

    def heartbeat_due(self, now: float, config: HeartbeatConfig) -> bool:
        return now - self.last_sent >= config.interval_s


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
