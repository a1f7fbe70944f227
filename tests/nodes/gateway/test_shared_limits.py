"""The shared limits table of `pdbus gateway --workers N` (nodes/gateway/shared_limits.py), with a
fake clock: workers sharing one table hold each key to its limits together (never N times them),
refuse as `RateLimiter` does, forget idle identities, fall back to per-worker counting only when
a group is full, survive a dead worker's counts being cleared, and refuse what is not a table."""

from __future__ import annotations

import itertools
import os

import pytest

from nodes.gateway.api_errors import ApiError
from nodes.gateway.protect import RateLimiter
from nodes.gateway.shared_limits import WAYS, LimitsTable, SharedRateLimiter, identity_key, table_bytes


def new_table(num_workers: int = 2, num_groups: int = 4) -> LimitsTable:
    buffer = bytearray(table_bytes(num_workers, num_groups))
    LimitsTable.format(buffer, num_workers, num_groups)
    return LimitsTable(buffer)


def workers(table: LimitsTable, **limits) -> list[SharedRateLimiter]:
    return [SharedRateLimiter(table, index, **limits) for index in range(table.num_workers)]


def outcomes(limiter, identity: str, now: float, count: int) -> list[int]:
    statuses = []
    for _ in range(count):
        try:
            limiter.acquire(identity, now)
            statuses.append(200)
        except ApiError as exc:
            statuses.append(exc.status)
    return statuses


def test_two_workers_share_one_bucket_not_two():
    first, second = workers(new_table(), rps=1.0, burst=4)
    assert outcomes(first, "key:a", 0.0, 3) == [200] * 3
    assert outcomes(second, "key:a", 0.0, 3) == [200, 429, 429]   # 4 in all, not 8
    assert outcomes(second, "key:b", 0.0, 1) == [200]             # per identity
    assert outcomes(first, "key:a", 1.0, 2) == [200, 429]         # one token refilled for both
    assert outcomes(second, "key:a", 1.0, 1) == [429]


def test_the_refusals_are_those_of_the_single_process_limiter():
    shared, alone = workers(new_table(), rps=0.5, burst=1)[0], RateLimiter(rps=0.5, burst=1)
    for limiter in (shared, alone):
        limiter.acquire("a", 0.0)
    errors = []
    for limiter in (shared, alone):
        with pytest.raises(ApiError) as refused:
            limiter.acquire("a", 0.5)
        errors.append(refused.value)
    assert [(e.status, e.message, e.headers) for e in errors] == [(429, errors[1].message, {"Retry-After": "2"})] * 2


def test_requests_in_flight_count_across_workers_and_release_where_they_were_taken():
    first, second = workers(new_table(), max_streams=2)
    first.acquire("key:a", 0.0)
    second.acquire("key:a", 0.0)
    with pytest.raises(ApiError, match="concurrent requests for this key \\(limit 2\\)"):
        first.acquire("key:a", 0.0)
    second.release("key:a")
    first.acquire("key:a", 0.0)
    for limiter in (first, first, second, second):   # more releases than acquires: never below 0
        limiter.release("key:a")
    assert first.table.num_in_flight(first.table.find(identity_key("key:a"))) == 0
    second.release("never-seen")   # a no-op


def test_a_dead_workers_counts_are_cleared_for_its_successor():
    table = new_table(num_workers=3)
    dead, alive, _ = workers(table, max_streams=2)
    dead.acquire("key:a", 0.0)
    dead.acquire("key:a", 0.0)
    with pytest.raises(ApiError):
        alive.acquire("key:a", 0.0)
    table.clear_worker(0)   # the parent, once it sees worker 0 dead
    alive.acquire("key:a", 0.0)
    with pytest.raises(ValueError):
        table.clear_worker(3)


def test_idle_identities_give_their_slot_up_and_a_full_group_counts_per_worker():
    table = new_table(num_groups=1)   # one group of WAYS slots: every identity competes for it
    first, second = workers(table, rps=1.0, burst=2, max_streams=1)
    names = [f"client-{i}" for i in range(WAYS)]
    for name in names:
        first.acquire(name, 0.0)           # WAYS identities, each with a request in flight
    assert outcomes(first, "late", 0.0, 2) == [200, 429]   # no slot: this worker counts it alone...
    assert outcomes(second, "late", 0.0, 1) == [200]       # ...so the limit holds per worker
    assert first.num_overflows == 2 and second.num_overflows == 1
    first.release("late")                  # released where it was admitted
    assert first.overflow.buckets["late"].num_streams == 0
    first.release(names[0])
    second.acquire("later", 1.0)           # released, but its bucket is not full yet: no slot
    assert second.num_overflows == 2 and table.find(identity_key("later")) is None
    second.release("later")
    second.acquire("later", 2.0)           # full again (burst / rps): its slot goes to "later"
    assert table.find(identity_key(names[0])) is None and table.find(identity_key("later")) is not None


def test_a_clock_behind_another_workers_never_takes_tokens_away():
    first, second = workers(new_table(), rps=1.0, burst=2)
    first.acquire("a", 10.0)
    second.acquire("a", 9.5)   # read its clock before the first took the lock
    assert outcomes(first, "a", 10.0, 1) == [429]
    assert outcomes(first, "a", 11.0, 1) == [200]


def test_what_is_not_a_table_is_refused():
    with pytest.raises(ValueError, match="too short"):
        LimitsTable(bytearray(10))
    with pytest.raises(ValueError, match="not a gateway limits table"):
        LimitsTable(bytearray(table_bytes(2, 4)))
    buffer = bytearray(table_bytes(2, 4))
    LimitsTable.format(buffer, 2, 4)
    with pytest.raises(ValueError, match="impossible size"):
        LimitsTable(buffer[:-1])
    for num_workers, num_groups in ((0, 4), (65, 4), (2, 0)):
        with pytest.raises(ValueError):
            LimitsTable.format(bytearray(table_bytes(max(num_workers, 1), max(num_groups, 1))), num_workers, num_groups)
    with pytest.raises(ValueError, match="not one of"):
        SharedRateLimiter(new_table(num_workers=2), 2)
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(ValueError, match="holds no gateway limits table"):
            LimitsTable.attach(read_fd)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_identity_keys_are_never_the_empty_mark_and_take_any_string():
    keys = {identity_key(name) for name in ("", "a", "key:" + "0" * 24, "\ud800", "127.0.0.1")}
    assert len(keys) == 5 and 0 not in keys


def test_a_created_table_is_one_memory_for_every_process_that_maps_it():
    parent = LimitsTable.create(num_workers=2, num_groups=16)
    worker = LimitsTable.attach(os.dup(parent.fd))   # what a worker maps from its inherited fd
    try:
        first, second = SharedRateLimiter(parent, 0, max_streams=1), SharedRateLimiter(worker, 1, max_streams=1)
        clock = itertools.count()
        first.acquire("key:a", next(clock))
        with pytest.raises(ApiError):
            second.acquire("key:a", next(clock))
        first.release("key:a")
        second.acquire("key:a", next(clock))
    finally:
        worker.close()
        parent.close()
    assert parent.fd == -1
