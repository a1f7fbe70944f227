"""bus.mailbox: the thread/asyncio hand-over and reply streams."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bus.mailbox import BusError, Mailbox, ReplyStream, Wakeups, _resolve_all
from bus.messages import Error, Final, Partial


def test_blocking_get_in_order_and_timeout():
    box = Mailbox()
    for i in range(3):
        box.put(i)
    assert [box.get(0.1) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TimeoutError):
        box.get(0.01)


def test_put_from_another_thread_wakes_a_blocked_reader():
    box = Mailbox()
    threading.Timer(0.05, box.put, args=("hello",)).start()
    assert box.get(5) == "hello"


async def test_async_get_is_woken_from_another_thread():
    box = Mailbox()
    threading.Timer(0.05, box.put, args=("hello",)).start()
    assert await asyncio.wait_for(box.get_async(), 5) == "hello"


async def test_a_cancelled_waiter_does_not_lose_the_item():
    box = Mailbox()
    waiter = asyncio.create_task(box.get_async())
    await asyncio.sleep(0)
    box.put("kept")      # resolution is scheduled on the loop...
    waiter.cancel()      # ...but the waiter is cancelled first
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(box.get_async(), 1) == "kept"


def _stream(items) -> ReplyStream:
    cancelled = []
    stream = ReplyStream("r1", cancelled.append, timeout=1)
    for item in items:
        stream.mailbox.put(item)
    stream.cancelled = cancelled
    return stream


def test_stream_yields_partials_then_final_and_stops():
    stream = _stream([Partial("r1", 0, "a"), Final("r1", 1, "b"), Partial("r1", 2, "late")])
    assert [r.body for r in stream] == ["a", "b"]


async def test_stream_async_iteration_raises_bus_error():
    stream = _stream([Partial("r1", 0), Error("r1", "node_lost", "gone", {"node_id": "d1"})])
    replies = []
    with pytest.raises(BusError) as info:
        async for reply in stream:
            replies.append(reply)
    assert len(replies) == 1 and info.value.code == "node_lost" and info.value.details == {"node_id": "d1"}


def test_stream_timeout_and_cancel():
    stream = _stream([])
    stream.timeout = 0.01
    with pytest.raises(TimeoutError):
        next(stream)
    stream.cancel()
    assert stream.cancelled == ["r1"] and list(stream) == []


async def test_a_burst_reaches_every_waiting_stream_in_order_with_one_wakeup_per_loop():
    streams = [ReplyStream(f"r{i}", lambda r: None, timeout=5) for i in range(8)]
    readers = [asyncio.ensure_future(s.collect_async()) for s in streams]
    await asyncio.sleep(0.01)   # every reader waits
    loop = asyncio.get_running_loop()
    wakeups, calls = Wakeups(), []
    original = loop.call_soon_threadsafe
    loop.call_soon_threadsafe = lambda *a: (calls.append(a), original(*a))[1]   # count cross-thread wake-ups

    def burst():
        for seq in range(3):
            for s in streams:
                s.mailbox.put(Final(s.request_id, seq) if seq == 2 else Partial(s.request_id, seq), wakeups)
        wakeups.send()

    try:
        await asyncio.to_thread(burst)
        results = await asyncio.gather(*readers)
    finally:
        del loop.call_soon_threadsafe
    assert [[r.seq for r in result] for result in results] == [[0, 1, 2]] * 8
    assert len([c for c in calls if c[0] is _resolve_all]) == 1   # (to_thread adds its own)


async def test_a_batched_item_for_a_reader_that_timed_out_waits_for_the_next_read():
    stream = ReplyStream("r", lambda r: None, timeout=0.01)
    with pytest.raises(TimeoutError):
        await stream.__anext__()
    wakeups = Wakeups()
    stream.mailbox.put(Partial("r", 0), wakeups)   # no waiter left: queued at once
    wakeups.send()
    assert (await stream.__anext__()).seq == 0
