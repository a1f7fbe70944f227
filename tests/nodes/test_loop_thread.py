"""`LoopThread`: coroutines and calls from another thread run on its loop; errors and timeouts come back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from nodes.loop_thread import LoopThread


def test_coroutines_and_calls_run_on_the_loops_own_thread():
    thread = LoopThread("loop-test")
    try:
        async def where() -> str:
            return threading.current_thread().name
        assert thread.run(where()) == "loop-test"
        seen = threading.Event()
        thread.call(seen.set)
        assert seen.wait(2.0)
        assert thread.submit(asyncio.sleep(0, result=7)).result(2.0) == 7
    finally:
        thread.stop()
    assert not thread._thread.is_alive()


def test_what_a_coroutine_raises_comes_back_and_a_slow_one_times_out():
    thread = LoopThread("loop-errors")
    try:
        async def broken() -> None:
            raise ValueError("bad chunk")
        with pytest.raises(ValueError, match="bad chunk"):
            thread.run(broken())
        with pytest.raises(TimeoutError):
            thread.run(asyncio.sleep(5), timeout=0.05)
    finally:
        thread.stop()
