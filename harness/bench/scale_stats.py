"""The pure arithmetic of `make bench-scale`: latency histograms that merge across processes,
the measuring window, offered rates from a load generator's timeline, and the derived figures.

Contract:
- `Histogram`: `add(seconds)`; `merge(other)`; `percentile(q) -> ms`; `count`; `to_json()` /
  `Histogram.from_json(d)`. Log buckets 2 % wide from 1 us: a percentile is exact to ~1 %, and
  client processes send counts, not samples, so merging is exact.
- `Window(start, end)`: `holds(t)`; `seconds`.
- `sent_between(timeline, start, end) -> tokens`: a load generator's `(t, tokens sent)` timeline
  read (linearly interpolated) at both ends of a window.
- `derive(...)`: tokens/s, CPU per token and CPU fraction per process role, and the broker's own
  ceiling (tokens/s divided by the broker's CPU fraction: the rate at which it would use one
  whole core).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

_BASE = math.log(1.02)


@dataclass
class Histogram:
    buckets: dict[int, int] = field(default_factory=dict)
    count: int = 0

    def add(self, seconds: float) -> None:
        bucket = int(math.log(max(seconds * 1e6, 1.0)) / _BASE)
        self.buckets[bucket] = self.buckets.get(bucket, 0) + 1
        self.count += 1

    def merge(self, other: Histogram) -> None:
        for bucket, n in other.buckets.items():
            self.buckets[bucket] = self.buckets.get(bucket, 0) + n
        self.count += other.count

    def percentile(self, q: float) -> float | None:
        """The q-th percentile (0-100) in milliseconds, the bucket's middle; None when empty."""
        if not self.count:
            return None
        rank, seen = q / 100 * self.count, 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return math.exp((bucket + 0.5) * _BASE) / 1000
        return math.exp((max(self.buckets) + 0.5) * _BASE) / 1000

    def to_json(self) -> dict:
        return {"buckets": {str(k): v for k, v in self.buckets.items()}, "count": self.count}

    @classmethod
    def from_json(cls, value: dict) -> Histogram:
        return cls({int(k): int(v) for k, v in value["buckets"].items()}, int(value["count"]))


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end

    @property
    def seconds(self) -> float:
        return self.end - self.start


def sent_between(timeline: list[list[float]], start: float, end: float) -> float:
    return _at(timeline, end) - _at(timeline, start)


def _at(timeline: list[list[float]], t: float) -> float:
    if not timeline:
        return 0.0
    times = [point[0] for point in timeline]
    i = bisect.bisect_right(times, t)
    if i == 0:
        return timeline[0][1] if t >= times[0] else 0.0
    if i == len(timeline):
        return timeline[-1][1]
    (t0, n0), (t1, n1) = timeline[i - 1], timeline[i]
    return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else n1


def derive(num_tokens: int, num_offered: float, seconds: float, cpu_s: dict[str, float]) -> dict[str, float | None]:
    """Figures of one measured point: `cpu_s` is CPU seconds per role (`broker`, `loadgen`,
    `client`, `gateway`) over the window. A figure that cannot be had (no token came, no CPU
    time counted) is None."""
    tokens_per_s = num_tokens / seconds
    out: dict[str, float | None] = {"tokens_per_s": tokens_per_s, "offered_per_s": num_offered / seconds}
    for role, used in cpu_s.items():
        out[f"{role}_cpu_frac"] = used / seconds
        out[f"{role}_us_per_token"] = used / num_tokens * 1e6 if num_tokens else None
    broker_cpu = cpu_s.get("broker", 0.0)
    out["broker_ceiling_tokens_per_s"] = tokens_per_s / (broker_cpu / seconds) if broker_cpu > 0 else None
    return out
