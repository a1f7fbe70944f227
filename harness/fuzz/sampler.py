"""Examples of hypothesis strategies for a time-bounded fuzz loop, drawn by `@given` itself.

Contract: `Sampler(seed).draw(strategy, count) -> list` runs hypothesis's own generation (a
`@given` test under `settings(max_examples=count, deadline=None, phases=[generate])`, no
database, no shrinking, every health check off) whose body only collects the examples; each call
is one round with its own derived seed, so a run is reproducible from `seed` and the sequence of
draws. `await adraw(strategy, count)` is the same in a worker thread, one draw at a time, so an
event loop (sessions' heartbeats) keeps running while hypothesis generates. Hypothesis may return
fewer than `count` (it stops when a small space is exhausted) and starts each round with simple
examples, then widens. The caller sends what it gets and comes back for more until its time is
up; `rounds` counts the calls.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

T = TypeVar("T")


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rounds = 0
        self._lock: asyncio.Lock | None = None

    async def adraw(self, strategy: st.SearchStrategy[T], count: int) -> list[T]:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            return await asyncio.to_thread(self.draw, strategy, count)

    def draw(self, strategy: st.SearchStrategy[T], count: int) -> list[T]:
        examples: list[T] = []

        @hypothesis.seed(self.seed * 1_000_003 + self.rounds)
        @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, derandomize=False)
        @given(strategy)
        def collect(example: T) -> None:
            examples.append(example)

        self.rounds += 1
        collect()
        return examples
