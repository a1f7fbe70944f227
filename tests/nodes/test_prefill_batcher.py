"""nodes/prefill_batcher.py: a batch is ready at its token budget or when the oldest prompt has
waited long enough; an aborted prompt leaves the queue (fake clock)."""

from __future__ import annotations

from nodes.engines.base import PrefillRequest
from nodes.prefill_batcher import PrefillBatcher


def test_prefill_batcher_waits_for_tokens_or_time(clock):
    batcher = PrefillBatcher(max_batch_tokens=10, max_wait_s=0.05)
    batcher.add(PrefillRequest("a", (1,) * 4), clock())
    assert batcher.next_batch(clock()) == [] and batcher.deadline() == clock() + 0.05
    batcher.add(PrefillRequest("b", (1,) * 4), clock())
    batcher.add(PrefillRequest("c", (1,) * 4), clock())
    assert [r.request_id for r in batcher.next_batch(clock())] == ["a", "b"]   # budget reached
    assert batcher.next_batch(clock()) == []
    clock.advance(0.05)
    assert [r.request_id for r in batcher.next_batch(clock())] == ["c"]          # waited long enough
    batcher.add(PrefillRequest("d", (1,) * 30), clock())
    assert [r.request_id for r in batcher.next_batch(clock())] == ["d"]          # alone over budget
    batcher.add(PrefillRequest("e", (1,) * 3), clock())
    assert batcher.remove("e") and not batcher.remove("e") and len(batcher) == 0
