"""`make bench-scale`'s bus-level load client: one process holding `--streams` concurrent decode
streams through a `BusClient` (role gateway), each reopened when its FINAL arrives.

`python -m harness.bench.scale_client --broker tcp://... --streams 1024 --max-tokens 128`.
Contract with the bench (one JSON object per stdout line, the window on stdin):
- opens its streams `--ramp-per-s` a second, and prints `{"event": "ready"}` once every stream
  has had a token (a refused stream — `full` — waits 20 ms and asks again; every refusal is
  counted);
- then reads one line `START END` (time.monotonic() seconds; one clock for every process on
  Linux) and counts, for tokens received within it: tokens, and the latency from the node's send
  (the token's `sent_at`, harness/loadgen) to the moment client code has the `Partial` from its
  `ReplyStream` — so the broker, both endpoints' I/O threads and the hand-over to the consuming
  task are in it;
- after END prints `{"event": "result", "tokens", "latency": Histogram JSON, "counters", "tail"}`
  (`tail`: when, into the window, the first 200 tokens slower than 5 ms came, and how slow) and
  exits, which ends its streams (the broker cancels them on the nodes).
Each stream asks for max_tokens drawn from [M/2, 3M/2], so streams that started together do not
end together. Tokens are checked in order per stream (`out_of_order` counts any other index);
bodies are read as the bus gives them, not through nodes/wire (that client runs in the gateway
measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop

from harness.bench.scale_stats import Histogram, Window
from harness.loadgen.core import STAMP_FIELD

REFUSED_PAUSE_S = 0.02
# Streams opened per second at the start: thousands of REQUESTs at once starve every process on
# two cores for a second, long enough for heartbeats to be missed and nodes to be dropped.
RAMP_PER_S = 4000.0
TAIL_S, MAX_TAIL = 0.005, 200   # tokens slower than the target: (seconds into the window, ms), the first 200
STALL_S = 30.0


class Tally:
    """What a load client counts, shared by the bus and the HTTP clients: readiness, the window,
    tokens, latency and counters."""

    def __init__(self, num_streams: int) -> None:
        self.num_streams = num_streams
        self.num_started = 0
        self.all_started = asyncio.Event()
        self.window = Window(float("inf"), float("inf"))
        self.num_tokens = 0
        self.latency = Histogram()
        self.counters: Counter[str] = Counter()
        self.tail: list[tuple[float, float]] = []

    def started(self) -> None:
        self.num_started += 1
        if self.num_started == self.num_streams:
            self.all_started.set()

    def token(self, sent_at: float, now: float) -> None:
        if self.window.holds(now):
            self.num_tokens += 1
            self.latency.add(now - sent_at)
            if now - sent_at > TAIL_S and len(self.tail) < MAX_TAIL:   # when the slow ones came: a stall or a drift
                self.tail.append((round(now - self.window.start, 4), round((now - sent_at) * 1000, 2)))

    def result(self) -> dict[str, Any]:
        return {"event": "result", "tokens": self.num_tokens, "latency": self.latency.to_json(),
                "counters": dict(self.counters), "tail": self.tail}


def emit(value: dict[str, Any]) -> None:
    print(json.dumps(value), flush=True)


async def drive(tally: Tally, consumers: list[Callable[[], Coroutine[Any, Any, None]]], ready_timeout: float,
                ramp_per_s: float = RAMP_PER_S) -> None:
    """Run the consumers, started `ramp_per_s` a second; say ready; read the window; report after it ends."""
    async def later(consume: Callable[[], Coroutine[Any, Any, None]], delay: float) -> None:
        await asyncio.sleep(delay)
        await consume()

    tasks = [asyncio.create_task(later(consume, i / ramp_per_s)) for i, consume in enumerate(consumers)]
    try:
        await asyncio.wait_for(tally.all_started.wait(), ready_timeout)
    except TimeoutError:
        tally.counters["not_ready"] = tally.num_streams - tally.num_started
    # What lives now lives to the end: out of the collector's sight, a full collection no longer
    # walks thousands of streams and tasks (a pause of milliseconds, in the latency tail).
    gc.freeze()
    emit({"event": "ready", "started": tally.num_started})
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start, end = (float(x) for x in line.split())
    tally.window = Window(start, end)
    await asyncio.sleep(max(0.0, end - time.monotonic()) + 0.05)
    emit(tally.result())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class BusLoad:
    def __init__(self, client: Any, tally: Tally, max_tokens: int, seed: int) -> None:
        from nodes import wire

        self.client, self.tally = client, tally
        self.random = random.Random(seed)
        low, high = max(1, max_tokens // 2), max(1, max_tokens * 3 // 2)
        self.bodies = [wire.to_wire(wire.DecodeRequestBody((1, 2, 3), wire.SamplingParams(max_tokens=m)))
                       for m in range(low, high + 1)]

    async def consume(self) -> None:
        from bus.mailbox import BusError
        from bus.messages import Final

        tally, counters, first = self.tally, self.tally.counters, True
        while True:
            stream = self.client.stream("decode", self.random.choice(self.bodies))
            expected = 0
            try:
                async for reply in stream:
                    if isinstance(reply, Final):
                        counters["finals"] += 1
                        break
                    body = reply.body
                    sent_at = body.get(STAMP_FIELD)
                    if sent_at is None:
                        continue   # the plan
                    tally.token(sent_at, time.monotonic())
                    if body["index"] != expected:
                        counters["out_of_order"] += 1
                    expected = body["index"] + 1
                    if first:
                        first = False
                        tally.started()
            except BusError as exc:
                counters[f"error.{exc.code}"] += 1
                await asyncio.sleep(REFUSED_PAUSE_S)
            except TimeoutError:
                counters["stalled"] += 1
                stream.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-timeout", type=float, default=60.0)
    parser.add_argument("--ramp-per-s", type=float, default=RAMP_PER_S, help="streams opened per second at the start")
    parser.add_argument("--switch-interval-ms", type=float, default=1.0,
                        help="GIL switch interval between the consuming thread and the endpoint's")
    args = parser.parse_args(argv)
    from bus.bus_client import BusClient
    from bus.log import configure_logging

    configure_logging(level="error")
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    client = BusClient(args.broker).start(10.0)
    tally = Tally(args.streams)
    try:
        load = BusLoad(client, tally, args.max_tokens, args.seed)
        uvloop.run(drive(tally, [load.consume] * args.streams, args.ready_timeout, args.ramp_per_s))
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
