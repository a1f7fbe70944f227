"""Kernel fixtures: `fresh_dispatch` lets a test change what dispatch sees (a warm-up that fails, a
backend forced) by clearing its cached plans before and after the test."""

from __future__ import annotations

import pytest

from nodes.engines.kernels import dispatch


def _clear() -> None:
    for cached in (dispatch._bf16_plan, dispatch._f32_plan, dispatch.kv_int8_backend):
        cached.cache_clear()


@pytest.fixture
def fresh_dispatch():
    _clear()
    yield dispatch
    _clear()
