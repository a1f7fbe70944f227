"""Hand-over between the endpoint's I/O thread and node code: a queue readable both by blocking
threads and by coroutines on any event loop, and the reply stream of one request.

Contract:
- `Mailbox.put(item, wakeups=None)` is called from any thread (the I/O thread in practice) and
  never blocks; with a `Wakeups`, hand-overs to waiting coroutines are batched per event loop
  until `wakeups.send()` (the I/O thread sends after each burst it dispatched).
  `get(timeout)` blocks a thread; `await get_async()` suspends a coroutine on whatever loop it
  runs on. Items come out in order, each exactly once, even when an awaiting task is cancelled.
- `ReplyStream` yields a request's PARTIAL messages then its FINAL, and raises `BusError` for an
  ERROR (from the serving node, or the broker's `node_lost`, `no_node`, ...). Use `async for`
  or, from a thread, plain `for` (each wait bounded by `timeout`, `TimeoutError` after it).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from bus.messages import Error, Final, Partial


class BusError(Exception):
    """A request failed: `code` is an ErrorCode value or the serving node's own code."""

    def __init__(self, request_id: str, code: str, message: str = "",
                 details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.request_id = request_id
        self.code = code
        self.message = message
        self.details = dict(details or {})


EMPTY = object()   # Mailbox.get_nowait: nothing waiting


class Wakeups:
    """Hand-overs to coroutines waiting on mailboxes, grouped by event loop, sent by `send()`."""

    def __init__(self) -> None:
        self._by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Mailbox, asyncio.Future, Any]]] = {}

    def add(self, loop: asyncio.AbstractEventLoop, mailbox: Mailbox, future: asyncio.Future, item: Any) -> None:
        self._by_loop.setdefault(loop, []).append((mailbox, future, item))

    def send(self) -> None:
        by_loop, self._by_loop = self._by_loop, {}
        for loop, handovers in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, handovers)
            except RuntimeError:   # that loop is closed: the items wait for another reader
                for mailbox, _, item in handovers:
                    mailbox.put(item)


def _resolve_all(handovers: list[tuple[Mailbox, asyncio.Future, Any]]) -> None:
    for mailbox, future, item in handovers:
        mailbox._resolve(future, item)


class Mailbox:
    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()

    def put(self, item: Any, wakeups: Wakeups | None = None) -> None:
        """`wakeups`: collect the hand-overs to waiting coroutines and make them in one call per
        event loop (`Wakeups.send`): a burst of replies costs one cross-thread wake-up, not one each."""
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                if future.done():
                    continue
                if wakeups is not None:
                    wakeups.add(loop, self, future, item)
                    return
                try:
                    loop.call_soon_threadsafe(self._resolve, future, item)
                    return
                except RuntimeError:   # that loop is closed; try the next waiter
                    continue
            self._items.append(item)
            self._ready.notify()

    def get_nowait(self) -> Any:
        """The next item, or `EMPTY`."""
        with self._lock:
            return self._items.popleft() if self._items else EMPTY

    def _resolve(self, future: asyncio.Future, item: Any) -> None:
        if future.done():   # cancelled meanwhile: keep the item for the next reader
            self.put_front(item)
        else:
            future.set_result(item)

    def put_front(self, item: Any) -> None:
        with self._lock:
            self._items.appendleft(item)
            self._ready.notify()

    def get(self, timeout: float | None = None) -> Any:
        """The next item; raises TimeoutError after `timeout` seconds (None: wait forever)."""
        with self._lock:
            if not self._ready.wait_for(lambda: self._items, timeout):
                raise TimeoutError("no message within the timeout")
            return self._items.popleft()

    async def get_async(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._items:
                return self._items.popleft()
            future = loop.create_future()
            self._waiters.append((loop, future))
        return await future

    def __len__(self) -> int:
        return len(self._items)


class ReplyStream:
    """The replies to one request, in order, ending with its FINAL (or a BusError)."""

    def __init__(self, request_id: str, cancel: Callable[[str], None], timeout: float | None = None) -> None:
        self.request_id = request_id
        self.timeout = timeout
        self.mailbox = Mailbox()
        self.done = False
        self._cancel = cancel

    def _unwrap(self, item: Partial | Final | Error) -> Partial | Final:
        if isinstance(item, Error):
            self.done = True
            raise BusError(item.request_id, item.code, item.message, item.details)
        if isinstance(item, Final):
            self.done = True
        return item

    def __iter__(self) -> ReplyStream:
        return self

    def __next__(self) -> Partial | Final:
        if self.done:
            raise StopIteration
        return self._unwrap(self.mailbox.get(self.timeout))

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> Partial | Final:
        if self.done:
            raise StopAsyncIteration
        item = self.mailbox.get_nowait()   # a burst arrived: no timer, no task
        if item is EMPTY:
            async with asyncio.timeout(self.timeout):   # cheaper than wait_for: no task per reply
                item = await self.mailbox.get_async()
        return self._unwrap(item)

    def collect(self) -> list[Partial | Final]:
        """Block until the stream ends; every reply, FINAL last."""
        return list(self)

    async def collect_async(self) -> list[Partial | Final]:
        return [reply async for reply in self]

    def cancel(self) -> None:
        """Tell the serving node to stop (CANCEL); no more replies will be delivered."""
        if not self.done:
            self.done = True
            self._cancel(self.request_id)


async def answer_map(stream: ReplyStream) -> dict | None:
    """The first reply's body of a one-answer service (the broker's stats) when it is a map; None
    on an ERROR, a timeout or any other body. The stream is cancelled either way."""
    try:
        async for reply in stream:
            return reply.body if isinstance(reply.body, dict) else None
    except (BusError, TimeoutError):
        return None
    finally:
        stream.cancel()
    return None
