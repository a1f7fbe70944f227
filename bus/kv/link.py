"""A shaped link for benchmarks: store-and-forward at a fixed rate (a token bucket with no burst).

Contract: `LinkShaper(bytes_per_s).release_time(nbytes, now)` reserves the link for `nbytes` and
returns when the last byte would arrive at the far end; the sender's link task hands the message to
the socket then, while encoding continues. It stands in for a network between machines on
loopback: messages queue behind each other exactly as on a link of that speed.

The link task waits on the event loop's timer, which has millisecond resolution (a 0.67 ms wait,
one int8 chunk of 10 Gbit/s wire, takes about 1.1 ms); release times are absolute, so a late send
delays one message, not the ones after it. A variant that slept the last part of each wait in an
executor thread was measured side by side in bench-kv and was not faster (its wake-ups compete for
the GIL and the two cores), so it was not kept.
"""

from __future__ import annotations


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
