"""Rate and concurrency limits shared by the gateway workers of one host (`pdbus gateway
--workers N`; docs/API.md, "Several gateway workers").

Buckets per worker would give each API key N times its limits, so the parent creates one table in
shared memory and every worker counts each identity's token bucket and requests in flight there:
a key's limits hold for the host as a whole, whichever worker the kernel hands a connection to.

Contract:
- `LimitsTable.create(num_workers, num_groups=NUM_GROUPS)`: the parent's table, in anonymous
  shared memory (a memfd: nothing on disk, gone with the last process that holds it); its `fd`
  goes to the workers (subprocess `pass_fds`). `LimitsTable.attach(fd)`: a worker's view of it.
  `LimitsTable(buffer, lock)`: over any writable buffer laid out by `LimitsTable.format` (tests:
  a bytearray). ValueError for a buffer or fd that holds no table, or bad sizes.
- `with table.locked():` around every read-modify-write (a record lock on the memfd).
- `table.clear_worker(index)`: the parent, before it restarts worker `index`: the in-flight counts
  of a dead worker died with it, and no one else could ever release them.
- `SharedRateLimiter(table, worker, rps, burst, max_streams)`: a `protect.Limiter` with the
  buckets and 429s of `protect.RateLimiter`, counted in the table. An identity whose group of
  WAYS slots is full of active identities is counted by this worker alone (its `overflow`
  RateLimiter, logged): its limits then hold per worker, rather than refuse it for others' traffic.
- `close()` unmaps the table (and closes its fd).

Layout (native byte order, struct of arrays, so a worker's column clears in one slice): a header
(magic, version, num_groups, ways, num_workers), then per slot `key` u64 (0: empty), `tokens`
f64, `updated` f64 (time.monotonic: one clock for every process of the host), then `in_flight`
u32 [worker][slot]. Slot `s` of identity key `k` lies in group `k % num_groups` (WAYS slots).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
from typing import Any

from bus.log import get_logger
from nodes.gateway.gateway_settings import MAX_WORKERS
from nodes.gateway.protect import RateLimiter, rate_exceeded, streams_exceeded

MAGIC, VERSION = b"pdbuslim", 1
HEADER = struct.Struct("=8sIIII")
HEADER_BYTES = 64              # keeps the arrays behind it 8-byte aligned
WAYS = 8                       # slots an identity may take: a lookup reads at most this many
NUM_GROUPS = 8192              # 65,536 identities; ~4 MB at 8 workers, touched only as used
log = get_logger("gateway")


def identity_key(identity: str) -> int:
    """64 bits of the identity: two share a bucket only by a hash collision (~n^2 / 2^65)."""
    digest = hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1   # 0 marks an empty slot


class _RecordLock:
    """A POSIX record lock on the table's fd. The kernel drops it when its holder dies, so a
    SIGKILLed worker never leaves the table locked (a semaphore it held would stop every worker
    for good). Record locks belong to the process, so the fd all workers inherit serves them all."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN)


def table_bytes(num_workers: int, num_groups: int = NUM_GROUPS) -> int:
    return HEADER_BYTES + num_groups * WAYS * (8 + 8 + 8 + 4 * num_workers)


def _anonymous_fd(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("pdbus-gateway-limits")
    else:   # no memfd: an unlinked file serves the same
        fd, path = tempfile.mkstemp(prefix="pdbus-gateway-limits-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class LimitsTable:
    def __init__(self, buffer: Any, lock: Any = None) -> None:
        view = memoryview(buffer).cast("B")
        if len(view) < HEADER_BYTES:
            raise ValueError("not a gateway limits table: too short")
        magic, version, self.num_groups, ways, self.num_workers = HEADER.unpack_from(view)
        if magic != MAGIC or version != VERSION or ways != WAYS:
            raise ValueError("not a gateway limits table (magic, version or ways differ)")
        if not 1 <= self.num_workers <= MAX_WORKERS or self.num_groups < 1 or \
                len(view) < table_bytes(self.num_workers, self.num_groups):
            raise ValueError("a gateway limits table of impossible size")
        self.num_slots = num_slots = self.num_groups * WAYS
        offsets = [HEADER_BYTES + i * 8 * num_slots for i in range(4)]
        self.keys = view[offsets[0]:offsets[1]].cast("Q")
        self.tokens = view[offsets[1]:offsets[2]].cast("d")
        self.updated = view[offsets[2]:offsets[3]].cast("d")
        self._in_flight_bytes = view[offsets[3]:offsets[3] + 4 * num_slots * self.num_workers]
        self.in_flight = self._in_flight_bytes.cast("I")
        self._view, self._buffer = view, buffer
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self.fd = -1

    @staticmethod
    def format(buffer: Any, num_workers: int, num_groups: int = NUM_GROUPS) -> None:
        """Stamp the header on a zeroed buffer of `table_bytes(...)` bytes."""
        if not 1 <= num_workers <= MAX_WORKERS or num_groups < 1:
            raise ValueError(f"a limits table serves 1..{MAX_WORKERS} workers and >= 1 group")
        HEADER.pack_into(buffer, 0, MAGIC, VERSION, num_groups, WAYS, num_workers)

    @classmethod
    def create(cls, num_workers: int, num_groups: int = NUM_GROUPS) -> LimitsTable:
        size = table_bytes(num_workers, num_groups)
        fd = _anonymous_fd(size)
        memory = mmap.mmap(fd, size)   # MAP_SHARED: the workers map the same pages
        cls.format(memory, num_workers, num_groups)
        table = cls(memory, _RecordLock(fd))
        table.fd = fd
        return table

    @classmethod
    def attach(cls, fd: int) -> LimitsTable:
        try:
            memory = mmap.mmap(fd, os.fstat(fd).st_size)
        except (OSError, ValueError) as exc:
            raise ValueError(f"fd {fd} holds no gateway limits table: {exc}") from exc
        table = cls(memory, _RecordLock(fd))
        table.fd = fd
        return table

    def locked(self) -> Any:
        return self._lock

    def find(self, key: int) -> int | None:
        first = (key % self.num_groups) * WAYS
        for slot in range(first, first + WAYS):
            if self.keys[slot] == key:
                return slot
        return None

    def slot_for(self, key: int, now: float, idle_after: float, fresh_tokens: float) -> int | None:
        """`key`'s slot; else an empty one, else the first idle one (no request in flight, the
        bucket full again by `now`), claimed with a full bucket; None when all WAYS are active."""
        first = (key % self.num_groups) * WAYS
        free = None
        for slot in range(first, first + WAYS):
            held = self.keys[slot]
            if held == key:
                return slot
            if free is None and (held == 0 or self._idle(slot, now, idle_after)):
                free = slot
        if free is not None:
            self.keys[free], self.tokens[free], self.updated[free] = key, fresh_tokens, now
        return free

    def _idle(self, slot: int, now: float, idle_after: float) -> bool:
        return self.num_in_flight(slot) == 0 and now - self.updated[slot] >= idle_after

    def num_in_flight(self, slot: int) -> int:
        return sum(self.in_flight[worker * self.num_slots + slot] for worker in range(self.num_workers))

    def add_in_flight(self, slot: int, worker: int, delta: int) -> None:
        index = worker * self.num_slots + slot
        self.in_flight[index] = max(0, self.in_flight[index] + delta)

    def clear_worker(self, worker: int) -> None:
        if not 0 <= worker < self.num_workers:
            raise ValueError(f"worker {worker} is not one of this table's {self.num_workers}")
        size = 4 * self.num_slots
        with self.locked():
            self._in_flight_bytes[worker * size:(worker + 1) * size] = bytes(size)

    def close(self) -> None:
        for view in (self.keys, self.tokens, self.updated, self.in_flight, self._in_flight_bytes, self._view):
            view.release()
        if isinstance(self._buffer, mmap.mmap):
            self._buffer.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedRateLimiter:
    def __init__(self, table: LimitsTable, worker: int, rps: float = 0.0, burst: int = 20,
                 max_streams: int = 0) -> None:
        if not 0 <= worker < table.num_workers:
            raise ValueError(f"worker {worker} is not one of the table's {table.num_workers}")
        self.table, self.worker = table, worker
        self.rps, self.burst, self.max_streams = rps, max(1, burst), max_streams
        # A bucket untouched this long is full again: forgetting it loses nothing.
        self.idle_after = self.burst / rps if rps else 0.0
        self.overflow = RateLimiter(rps, burst, max_streams)
        self.num_overflows = 0

    def acquire(self, identity: str, now: float) -> None:
        with self.table.locked():
            slot = self.table.slot_for(identity_key(identity), now, self.idle_after, float(self.burst))
            if slot is not None:
                self._admit(slot, now)   # a 429 raised here releases the lock on its way out
                return
        self.num_overflows += 1
        if self.num_overflows & (self.num_overflows - 1) == 0:   # 1, 2, 4, 8...: bounded log lines
            log.warning("limits_table_full", worker=self.worker, num_overflows=self.num_overflows)
        self.overflow.acquire(identity, now)

    def _admit(self, slot: int, now: float) -> None:
        table = self.table
        if self.max_streams and table.num_in_flight(slot) >= self.max_streams:
            raise streams_exceeded(self.max_streams)
        if self.rps:
            # Another worker may have stamped a later `now` while this one waited for the lock.
            updated = table.updated[slot]
            tokens = min(self.burst, table.tokens[slot] + max(0.0, now - updated) * self.rps)
            table.tokens[slot], table.updated[slot] = tokens, max(now, updated)
            if tokens < 1.0:
                raise rate_exceeded(self.rps, tokens)
            table.tokens[slot] = tokens - 1.0
        table.add_in_flight(slot, self.worker, 1)

    def release(self, identity: str) -> None:
        held = self.overflow.buckets.get(identity)
        if held is not None and held.num_streams:   # admitted by this worker alone: released there
            self.overflow.release(identity)
            return
        key = identity_key(identity)
        with self.table.locked():
            slot = self.table.find(key)
            if slot is not None:
                self.table.add_in_flight(slot, self.worker, -1)
