"""Fixtures for socket-level bus tests: a real broker on a loopback port, in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import uvloop

from bus.broker import Broker
from bus.broker_tables import BrokerEvent
from bus.liveness import HeartbeatConfig
from harness.cluster_procs import poll_until


class BrokerThread:
    """A `Broker` serving on its own uvloop thread; `events` collects what it published."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:0", heartbeat: HeartbeatConfig | None = None,
                 **options) -> None:
        self.requested_endpoint = endpoint
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.options = options
        self.events: list[BrokerEvent] = []
        self.broker: Broker | None = None
        self.endpoint: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> BrokerThread:
        self._thread.start()
        assert self._ready.wait(10), "broker did not start"
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self.broker = Broker(self.requested_endpoint, heartbeat=self.heartbeat, **self.options)
            self.broker.add_listener(self.events.append)
            task = asyncio.create_task(self.broker.serve())
            self.endpoint = await self.broker.wait_bound()
            self._ready.set()
            await task
        uvloop.run(main())

    def call(self, function: Callable[[], object]) -> object:
        """Run `function` on the broker's loop (safe access to its tables) and return its result."""
        async def wrapper() -> object:
            return function()
        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(5)

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.broker.stop)
            self._thread.join(5)


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> object:
    """Poll `predicate` until it is truthy; fail the test after `timeout` (generous: CI is loaded)."""
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"condition not met within {timeout}s")
    return value


@pytest.fixture
def broker_thread():
    broker = BrokerThread().start()
    yield broker
    broker.stop()
