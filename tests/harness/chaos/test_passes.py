"""A pass with a fake driver: bounded concurrency, the fault task sees streams under way, extra
clients' records come back apart, and a driver's records are visible while they stream."""

from __future__ import annotations

import asyncio
import time

from harness.chaos.chaos_workload import build_workload
from harness.chaos.drivers import new_record
from harness.chaos.passes import FaultEvent, run_pass


class FakeDriver:
    def __init__(self) -> None:
        self.running = self.most_running = 0
        self.opened = self.closed = False

    async def open(self) -> None:
        self.opened = True

    async def close(self) -> None:
        self.closed = True

    async def run(self, spec, abort_after=None):
        record = new_record(self, spec, exact=True)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        for i in range(spec.max_tokens):
            await asyncio.sleep(0.005)
            record.token_ids.append(i)
            record.token_times.append(time.monotonic())
            if abort_after is not None and i + 1 >= abort_after:
                record.aborted = True
                break
        else:
            record.ok = True
        record.finished_at = time.monotonic()
        self.running -= 1
        return record


def test_a_pass_streams_everything_with_bounded_concurrency_while_the_fault_watches():
    driver, specs = FakeDriver(), build_workload(0, 6, 4, 5, 512)
    seen = []

    async def fault(progress):
        live = await progress.streaming(3)
        seen.append(len(live))
        return FaultEvent(time.monotonic(), "decode-0")

    async def extra(progress):
        return [await driver.run(specs[0], abort_after=2)]

    result = asyncio.run(run_pass(driver, specs, 2, fault, [extra]))
    assert [r.name for r in result.records] == [s.name for s in specs] and all(r.ok for r in result.records)
    assert driver.most_running <= 3 and seen and seen[0] >= 1   # two slots plus the extra client
    assert result.fault.target == "decode-0" and len(result.extras) == 1 and result.extras[0].aborted
    assert driver.opened and driver.closed


def test_a_pass_without_a_fault_has_no_event():
    result = asyncio.run(run_pass(FakeDriver(), build_workload(1, 2, 4, 2, 512), 4))
    assert result.fault is None and result.extras == [] and len(result.records) == 2
