"""The batching policy a prefill node runs (plain data; the node supplies `now`).

Contract: `PrefillBatcher(max_batch_tokens=..., max_wait_s=...)` queues prompts in arrival order; a
batch is ready when the queued prompts reach `max_batch_tokens`, or when the oldest has waited
`max_wait_s`. `next_batch(now)` hands out the oldest prompts up to the token budget (at least one,
so a prompt over the budget runs alone), `remove(request_id)` drops a prompt aborted before its
pass, `deadline()` says when the node must wake at the latest.
"""

from __future__ import annotations

from collections import deque

from nodes.engines.base import PrefillRequest


class PrefillBatcher:
    """Queue of prompts waiting for a prefill pass (plain data; the node supplies `now`)."""

    def __init__(self, *, max_batch_tokens: int, max_wait_s: float) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self._queue: deque[tuple[PrefillRequest, float]] = deque()
        self._num_tokens = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def num_queued_tokens(self) -> int:
        return self._num_tokens

    def add(self, request: PrefillRequest, now: float) -> None:
        self._queue.append((request, now))
        self._num_tokens += len(request.prompt_token_ids)

    def remove(self, request_id: str) -> bool:
        """Drop a queued request (abort before its prefill ran)."""
        for item in self._queue:
            if item[0].request_id == request_id:
                self._queue.remove(item)
                self._num_tokens -= len(item[0].prompt_token_ids)
                return True
        return False

    def deadline(self) -> float | None:
        """When the oldest queued prompt must run at the latest (None when empty)."""
        return self._queue[0][1] + self.max_wait_s if self._queue else None

    def is_ready(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and (self._num_tokens >= self.max_batch_tokens or now >= deadline)

    def next_batch(self, now: float) -> list[PrefillRequest]:
        """The prompts for the next pass (FIFO, up to the token budget; at least one), or []."""
        if not self.is_ready(now):
            return []
        batch: list[PrefillRequest] = []
        num_tokens = 0
        while self._queue:
            size = len(self._queue[0][0].prompt_token_ids)
            if batch and num_tokens + size > self.max_batch_tokens:
                break
            batch.append(self._queue.popleft()[0])
            num_tokens += size
        self._num_tokens -= num_tokens
        return batch
