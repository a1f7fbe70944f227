"""The chaos scenarios whose fault is on the client side: `slow-consumer` and `abort-storm`.

Contract (the `Scenario` hooks of harness/chaos/scenarios.py, which registers them):
- slow-consumer: `stalled_client(ctx)` is one extra SSE client through the gateway that stops
  reading with a long generation in flight (none without a gateway); `stall_begins(ctx, progress)`
  returns the FaultEvent once it has stalled (or after 30 s); `check_stalled` is `ok` when the gateway cut at
  least one stalled consumer off (`gateway_stalled` grew).
- abort-storm: `storm(ctx)` is max(4, number of specs) extra clients through the pass's driver,
  each starting after a seeded random delay (0-1 s) and disconnecting after a seeded random
  number of tokens; `storm_begins` returns once one has aborted (or after 60 s); `check_storm`
  counts the streams the nodes cancelled (always `ok`; the common checks judge the workload's).
The extra clients' records are not compared with the fault-free run.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from harness.chaos.chaos_workload import RequestSpec
from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent, Progress
from harness.chaos.stalled import stalled_sse_stream

if TYPE_CHECKING:   # scenarios.py imports this module to register its hooks: no import back at run time
    from harness.chaos.scenarios import Ctx


# -- slow-consumer ---------------------------------------------------------------------------
async def stall_begins(ctx: Ctx, progress: Progress) -> FaultEvent:
    await progress.wait_for(lambda: any(r.stalled for r in progress.records), timeout=30.0)
    return FaultEvent(time.monotonic(), "client", {"kind": "stopped reading"})


def stalled_client(ctx: Ctx) -> list:
    if ctx.cluster.gateway_url is None:
        return []
    # Enough tokens (~200 B of SSE each) to overflow the gateway's write buffer (aiohttp's 64 KiB
    # high-water mark) and both kernel socket buffers; the gateway cuts the client off at the latest
    # when the stream's last writes block, so `stall_hold_s` exceeds the time to generate them.
    spec = RequestSpec(9999, ctx.specs[0].prompt_token_ids, min(900, 1900 - len(ctx.specs[0].prompt_token_ids)))

    gateway = ctx.cluster.gateway
    num_before = len(gateway.find("access", outcome="stalled"))

    async def run(progress: Progress) -> list[StreamRecord]:
        def cut_off() -> bool:
            return len(gateway.find("access", outcome="stalled")) > num_before
        return [await stalled_sse_stream(ctx.cluster.gateway_url, spec, progress, cut_off, hold_s=ctx.stall_hold_s)]
    return [run]


def check_stalled(ctx: Ctx, before: dict, after: dict) -> dict:
    cut = after["gateway_stalled"] - before["gateway_stalled"]
    return {"ok": cut >= 1, "stalled_consumers_cut_off": cut}


# -- abort-storm -----------------------------------------------------------------------------
async def storm_begins(ctx: Ctx, progress: Progress) -> FaultEvent:
    await progress.wait_for(lambda: any(r.aborted for r in progress.records), timeout=60.0)
    return FaultEvent(time.monotonic(), "clients", {"kind": "disconnects"})


def storm(ctx: Ctx) -> list:
    num = max(4, len(ctx.specs))
    plans = [(ctx.rng.uniform(0.0, 1.0), ctx.rng.randint(1, max(1, ctx.specs[0].max_tokens - 2))) for _ in range(num)]

    def one(delay: float, after_tokens: int, spec: RequestSpec):
        async def run(progress: Progress) -> list[StreamRecord]:
            await asyncio.sleep(delay)
            return [await ctx.driver.run(spec, abort_after=after_tokens)]
        return run

    return [one(d, k, RequestSpec(1000 + i, ctx.specs[i % len(ctx.specs)].prompt_token_ids, ctx.specs[0].max_tokens))
            for i, (d, k) in enumerate(plans)]


def check_storm(ctx: Ctx, before: dict, after: dict) -> dict:
    cancelled = after["cancels"] - before["cancels"]
    return {"ok": True, "streams_cancelled_on_nodes": cancelled}

