"""Fixtures the node tests share: a KV thread (`LoopThread`) for the work objects' receivers."""

from __future__ import annotations

import pytest

from nodes.loop_thread import LoopThread


@pytest.fixture
def kv_thread():
    thread = LoopThread("kv-test")
    yield thread
    thread.stop()
