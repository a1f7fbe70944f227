"""A shaped link for benchmarks: store-and-forward at a fixed rate (a token bucket with no burst).

Contract: `LinkShaper(bytes_per_s).release_time(nbytes, now)` reserves the link for `nbytes` and
returns when the last byte would arrive at the far end; the sender's link task hands the message to
the socket then (`await sleep_precisely(delay)`), while encoding continues. It stands in for a
network between machines on loopback: messages queue behind each other exactly as on a link of
that speed.

Why `sleep_precisely`: asyncio's timers have millisecond resolution (epoll_wait's timeout; libuv's
timers under uvloop): a 0.67 ms wait took 1.1-1.2 ms on the default loop, and any wait under
0.5 ms took either 0 or 1.1 ms. On a 10 Gbit/s link a 0.83 MB int8 chunk is 0.67 ms of wire, so
the link ran well below its rate for small messages and its figures favoured big ones.
"""

from __future__ import annotations

import asyncio
import time

# Waits longer than this sleep on the loop's own timer first, then precisely for the rest.
COARSE_MARGIN_S = 0.002


async def sleep_precisely(delay: float) -> None:
    """asyncio.sleep to within ~0.1 ms: the last part of the wait is a time.sleep in the loop's
    default executor thread, whose completion wakes the loop at once."""
    if delay <= 0:
        return
    deadline = time.perf_counter() + delay
    if delay > 2 * COARSE_MARGIN_S:
        await asyncio.sleep(delay - COARSE_MARGIN_S)
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, remaining)


class LinkShaper:
    def __init__(self, bytes_per_s: float) -> None:
        if bytes_per_s <= 0:
            raise ValueError("link speed must be positive")
        self.bytes_per_s = bytes_per_s
        self._free_at = 0.0

    def release_time(self, nbytes: int, now: float) -> float:
        self._free_at = max(now, self._free_at) + nbytes / self.bytes_per_s
        return self._free_at


def gbit(value: float) -> float:
    """Gbit/s -> bytes/s."""
    return value * 1e9 / 8
