"""`LoopThread`: a uvloop event loop on its own daemon thread, for asyncio code (the KV sender and
receiver) beside a node's synchronous engine loop (nodes/runtime.py).

Contract: `LoopThread(name)` starts the thread and its loop; from any thread, `submit(coro)` ->
a `concurrent.futures.Future`, `run(coro, timeout=30)` waits for its result (raising what it
raised, or TimeoutError), `call(function, *args)` schedules a plain call on the loop; `stop()`
stops the loop and joins the thread (at most 2 s: it is a daemon).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop


class LoopThread:
    """A uvloop event loop on its own daemon thread; coroutines are submitted from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine, timeout: float | None = 30.0) -> Any:
        return self.submit(coro).result(timeout)

    def call(self, function: Callable, *args: Any) -> None:
        self.loop.call_soon_threadsafe(function, *args)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(2.0)
