"""HeapTrimmer: trims only after work ran and the node then stayed idle; never while busy."""

from __future__ import annotations

import sys

import pytest

from nodes.heap import HeapTrimmer, _glibc_trim


def trimmer(idle_after_s: float = 0.2):
    calls = []
    return HeapTrimmer(idle_after_s, trim=lambda: calls.append(1)), calls


def test_a_node_that_never_worked_never_trims():
    heap, calls = trimmer()
    for step in range(20):
        heap.on_iteration(False, step * 0.1)
    assert calls == []


def test_it_trims_once_after_the_idle_delay_that_follows_work():
    heap, calls = trimmer(0.2)
    heap.on_iteration(True, 0.0)
    heap.on_iteration(False, 0.1)
    heap.on_iteration(False, 0.25)
    assert calls == []                      # idle for 0.15 s only
    assert heap.on_iteration(False, 0.31) >= 0.0   # trimmed: how long it took
    assert heap.on_iteration(False, 0.5) is None
    heap.on_iteration(False, 5.0)
    assert calls == [1] and heap.num_trims == 1


def test_work_in_between_restarts_the_idle_clock():
    heap, calls = trimmer(0.2)
    heap.on_iteration(True, 0.0)
    heap.on_iteration(False, 0.1)
    heap.on_iteration(True, 0.25)           # busy again before the delay ran out
    heap.on_iteration(False, 0.3)
    heap.on_iteration(False, 0.45)
    assert calls == []
    heap.on_iteration(False, 0.5)
    assert calls == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_real_trim_runs_here():
    trim = _glibc_trim()
    assert trim is not None
    trim()
