"""Give memory the engine freed back to the OS once a node goes quiet.

glibc keeps what a burst freed (KV of finished requests, batch temporaries, failed-over transfers)
in its arenas, so a node's resident size stays at its peak and a leak check cannot tell retention
from a leak. `HeapTrimmer.on_iteration(busy, now)` is called once per node-loop iteration; after
`idle_after_s` without work, and only if some work ran since the last trim, it calls glibc's
`malloc_trim(0)` (which also returns free pages inside the arenas) and returns how long that took
(None when it did not trim); `before_trim` (optional) runs first, for caches that keep memory for
a busy node (the decode node's KV buffers, nodes/kv_buffers.py). Off the hot path by design: a
busy node never trims. Elsewhere than glibc it does nothing.
`use_mmap_above(num_bytes)` makes glibc serve every allocation of at least `num_bytes` from a
mapping of its own (M_MMAP_THRESHOLD, which also ends glibc's raising of that threshold after a
large free): a decode node's imported KV and cached sessions then go back to the OS when freed.
Why: with the dynamic threshold they land in the heap once a first one has been freed, and the holes
evictions leave are more than malloc_trim gives back (`make chaos`'s kill-decode on the real model
showed the surviving decode node's RSS far above its baseline). Only decode nodes ask for it: a
prefill's large temporaries, mapped and faulted in afresh each time, would slow its prefills.
`keep_freed_heap(num_bytes)` (M_TRIM_THRESHOLD) lets free() hand the heap's top back to the OS only
beyond `num_bytes`, so memory freed while a node is busy is reused by its next allocations and goes
back when the node goes quiet (the trimmer above). Why: a decode node receives a transfer's KV as
ZeroMQ's own buffers of up to a chunk each (bus/kv/pieces.py); with glibc's default trim threshold
(fixed at 128 KiB once M_MMAP_THRESHOLD is set) one transfer's frames, freed together, are trimmed
and the next transfer's faulted in afresh on ZeroMQ's I/O thread.
The mmap threshold therefore sits above the largest frame a chunk sends (DECODE_MMAP_THRESHOLD): a
chunk of exactly 4 MiB is a 4 MiB payload plus ZeroMQ's header, and with the threshold at 4 MiB
glibc would map, and the I/O thread fault in, every such message afresh. Such chunks are those of
a plane split by tokens (a long prompt) and of models whose layer of KV is 4 MiB.
`configure_decode_heap()` sets both for a decode node (and for bench-kv's receiving process).
`freeze_startup_objects()`, called once a process has loaded what it keeps for life (weights,
tokenizer), moves those objects out of the garbage collector's reach (as vLLM does after loading):
a gen-2 collection that walked them would hold the GIL the bus heartbeat thread needs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable

from bus.kv.layout import DEFAULT_CHUNK_BYTES

IDLE_AFTER_S = 0.2
# Above a whole chunk's payload frame (DEFAULT_CHUNK_BYTES, plus ZeroMQ's header) and below the
# imported KV and sessions that should go back to the OS (12-24 MB for a 512-token prompt).
DECODE_MMAP_THRESHOLD = DEFAULT_CHUNK_BYTES + (1 << 20)
DECODE_TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD = -1      # malloc.h
_M_MMAP_THRESHOLD = -3


def freeze_startup_objects() -> None:
    gc.collect()
    gc.freeze()


def _mallopt(param: int, value: int, mallopt: Callable[[int, int], int] | None) -> bool:
    """True if glibc took the setting (nothing happens, False, elsewhere than glibc)."""
    if mallopt is None:
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):
            return False
    return mallopt(param, value) == 1


def use_mmap_above(num_bytes: int, mallopt: Callable[[int, int], int] | None = None) -> bool:
    return _mallopt(_M_MMAP_THRESHOLD, num_bytes, mallopt)


def keep_freed_heap(num_bytes: int, mallopt: Callable[[int, int], int] | None = None) -> bool:
    return _mallopt(_M_TRIM_THRESHOLD, num_bytes, mallopt)


def configure_decode_heap() -> None:
    use_mmap_above(DECODE_MMAP_THRESHOLD)   # imported KV and sessions go back to the OS when freed
    keep_freed_heap(DECODE_TRIM_THRESHOLD)  # received KV frames are reused until the node goes quiet


def _glibc_trim() -> Callable[[], None] | None:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError):   # not glibc (musl, macOS): nothing to trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)   # ctypes releases the GIL for the call


class HeapTrimmer:
    def __init__(self, idle_after_s: float = IDLE_AFTER_S, trim: Callable[[], None] | None = None,
                 before_trim: Callable[[], None] | None = None) -> None:
        self.idle_after_s = idle_after_s
        self._trim = trim if trim is not None else _glibc_trim()
        self._before_trim = before_trim
        self._idle_since: float | None = None
        self._worked_since_trim = False
        self.num_trims = 0

    def on_iteration(self, busy: bool, now: float) -> float | None:
        if busy:
            self._idle_since, self._worked_since_trim = None, True
            return None
        if self._idle_since is None:
            self._idle_since = now
        if not (self._worked_since_trim and now - self._idle_since >= self.idle_after_s and self._trim is not None):
            return None
        started = time.perf_counter()
        if self._before_trim is not None:
            self._before_trim()   # caches let go of what they keep for a busy node first
        self._trim()
        self._worked_since_trim = False
        self.num_trims += 1
        return time.perf_counter() - started
