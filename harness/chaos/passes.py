"""One pass of the workload: every request streamed through a driver with bounded concurrency,
while an optional fault task and extra clients (abort storm, stalled consumer) run beside it.

Contract: `await run_pass(driver, specs, concurrency, fault=None, extras=()) -> PassResult`.
`fault(progress)` is a coroutine that waits for its trigger on `progress` (the records so far),
injects, and returns a `FaultEvent`; `extras` are coroutines returning `StreamRecord`s that are not
compared with the reference (they end on purpose). The pass ends when every task ended; each is
bounded by the driver's request timeout, the fault by `FAULT_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.chaos.chaos_workload import RequestSpec
from harness.chaos.drivers import StreamRecord

FAULT_TIMEOUT_S = 60.0


@dataclass
class FaultEvent:
    at: float                       # monotonic time of the fault
    target: str                     # node id, "broker", "data-plane", "clients"
    details: dict[str, Any] = field(default_factory=dict)
    healed_at: float | None = None


class Progress:
    """What the fault task can watch: the records as they stream."""

    def __init__(self) -> None:
        self.records: list[StreamRecord] = []

    def live(self) -> list[StreamRecord]:
        return [r for r in self.records if r.finished_at is None]

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.01) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := predicate():
                return value
            await asyncio.sleep(interval)
        return None

    async def streaming(self, min_tokens: int = 3, timeout: float = 30.0) -> list[StreamRecord]:
        """Wait until some stream has at least `min_tokens` tokens; the live streams then."""
        return await self.wait_for(lambda: [r for r in self.live() if len(r.token_times) >= min_tokens], timeout) or []


@dataclass
class PassResult:
    records: list[StreamRecord]
    extras: list[StreamRecord]
    fault: FaultEvent | None
    started_at: float
    finished_at: float


async def run_pass(driver: Any, specs: Sequence[RequestSpec], concurrency: int,
                   fault: Callable[[Progress], Awaitable[FaultEvent]] | None = None,
                   extras: Sequence[Callable[[Progress], Awaitable[list[StreamRecord]]]] = ()) -> PassResult:
    progress = Progress()
    slots = asyncio.Semaphore(concurrency)
    started_at = time.monotonic()

    async def one(spec: RequestSpec) -> StreamRecord:
        async with slots:
            return await driver.run(spec)

    await driver.open()
    try:
        driver.progress = progress
        fault_task = asyncio.ensure_future(asyncio.wait_for(fault(progress), FAULT_TIMEOUT_S)) if fault else None
        extra_tasks = [asyncio.ensure_future(extra(progress)) for extra in extras]
        records = await asyncio.gather(*(one(spec) for spec in specs))
        event = await fault_task if fault_task else None
        extra_records = [r for group in await asyncio.gather(*extra_tasks) for r in group]
    finally:
        await driver.close()
    return PassResult(list(records), extra_records, event, started_at, time.monotonic())
