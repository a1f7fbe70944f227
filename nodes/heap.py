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
large free): a decode node's imported KV and cached sessions (12-24 MB for a 512-token prompt) then
go back to the OS when freed. With the default dynamic threshold they landed in the heap once a
first one had been freed, and the holes evictions left were more than malloc_trim gave back:
`make chaos`'s kill-decode on the real model (fp32, 512-token prompts) found the surviving decode
node 130-180 MiB above its baseline in 2 of 3 runs, 0 of 3 with this at 4 MiB. Only decode nodes
ask for it: a prefill's large temporaries, mapped and faulted in afresh each time, made a
1024-token bf16 prefill 3-13 % slower (ad-hoc timing).
`keep_freed_heap(num_bytes)` (M_TRIM_THRESHOLD) lets free() hand the heap's top back to the OS only
beyond `num_bytes`, so memory freed while a node is busy is reused by its next allocations and goes
back when the node goes quiet (the trimmer above). Why: a decode node receives a transfer's KV as
ZeroMQ's own buffers (a raw transfer keeps them, bus/kv/pieces.py) of up to a chunk each; with
glibc's default trim threshold (fixed at 128 KiB once M_MMAP_THRESHOLD is set) the frames of one
transfer, freed together, were trimmed and the next transfer's frames faulted in afresh on
ZeroMQ's I/O thread. An ad-hoc A/B of receiver processes (raw fp32 KV, 1024 tokens, the process's
whole CPU time per transfer): 33 ms copying into a pooled buffer, 34 ms keeping the frames with the
default threshold, 21 ms keeping them with this at 256 MiB.
The mmap threshold therefore sits above the largest frame a chunk sends (DECODE_MMAP_THRESHOLD). At
4 MiB it did not: a chunk of exactly 4 MiB is a 4 MiB payload plus ZeroMQ's few bytes of header, so
glibc mapped each one afresh and the I/O thread faulted in 1024 pages for it (ad hoc: six such
messages took 20 ms with 6152 page faults; with the threshold at 8 MiB, 11 ms and 2 faults). Such
chunks are those of a plane split by tokens (a long prompt: 16k tokens of SmolLM2 in float32) and
of models whose layer of KV is 4 MiB (8 KV heads of 128 dims, 1024 tokens, bf16); SmolLM2's
1024-token chunks are whole layers of 3-3.75 MiB, below either threshold.
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
