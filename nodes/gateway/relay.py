"""A bounded buffer between one cluster stream and one client socket, with a stall cut-off.

Contract: `relay = Relay(generation, max_buffered, stall_timeout_s)`; `async for token in relay`
yields the generation's StreamTokens; afterwards `relay.result` (GenerationResult) is set, or
iteration raised `ClusterError`, or `StalledConsumer` when the consumer took nothing for
`stall_timeout_s` while the buffer was full (the cluster request is then aborted). A pump task
moves tokens from the cluster into a queue of at most `max_buffered`, so a slow consumer holds
at most that many tokens (the cluster client's own queue drains into it); `aclose()` aborts the
cluster request (both streams cancelled, the decode node frees the KV) and is idempotent.
The consumer bounds its own socket writes with `write_timeout_s` (the same stall timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

_END = object()


async def within(timeout_s: float, awaitable: Any) -> Any:
    """`await awaitable`, TimeoutError after `timeout_s`. Unlike 3.11's `wait_for`, `asyncio.timeout`
    never swallows a cancellation that races with completion (a disconnect must always abort)."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


class StalledConsumer(Exception):
    """The client stopped reading: its buffer stayed full past the stall timeout."""


class Relay:
    def __init__(self, generation: Any, max_buffered: int, stall_timeout_s: float) -> None:
        self.generation = generation
        self.write_timeout_s = stall_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=max_buffered)
        self.result = None
        self.stalled = False
        self._pump: asyncio.Task | None = None

    def __aiter__(self) -> Relay:
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __anext__(self) -> Any:
        item = await self.queue.get()
        if item is _END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    async def _put(self, item: Any) -> None:
        try:
            await within(self.stall_timeout_s, self.queue.put(item))
        except TimeoutError:
            self.stalled = True
            raise StalledConsumer(f"the client read nothing for {self.stall_timeout_s:g}s") from None

    async def _run(self) -> None:
        try:
            async for token in self.generation:
                await self._put(token)
            self.result = self.generation.result
            await self._put(_END)
        except StalledConsumer as exc:
            await self.generation.aclose()
            self._force(exc)
        except Exception as exc:   # ClusterError (or a bug): the consumer re-raises it
            self._force(exc)

    def _force(self, item: Any) -> None:
        """Hand over an ending item even when the queue is full (drop the oldest unread token)."""
        while True:
            try:
                self.queue.put_nowait(item)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()

    async def aclose(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        await self.generation.aclose()
        self._force(_END)   # a consumer still iterating ends now
