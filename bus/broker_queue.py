"""Requests the routing policy deferred (`bus.routing.Defer`): bounded FIFO queues per service.

Contract: plain data owned by `BrokerCore` (no I/O, no clock of its own). An entry keeps the
REQUEST's frames as received, so a dispatched request is forwarded exactly as if it had been
routed at once. `push` never checks the bound: the broker asks `num_queued(service)` first.
Each service's queue is an insertion-ordered dict, so the head is O(1) and a cancel or a
client's departure removes an entry from the middle in O(1) too. `num_bytes` is what the queued
frames hold in all; the broker refuses to queue past `MAX_QUEUED_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bus.broker_tables import Node

MAX_QUEUED_BYTES = 256 << 20


@dataclass(slots=True, eq=False)
class Deferred:
    """One waiting request: who asked, what to forward, and until when it may wait."""

    request_id: bytes
    service: bytes
    client: Node
    frames: list
    queued_at: float
    deadline: float
    retry_after_s: float

    @property
    def num_bytes(self) -> int:
        return sum(map(len, self.frames))


class DeferredQueue:
    def __init__(self) -> None:
        self.by_id: dict[bytes, Deferred] = {}   # the hot path checks duplicates here
        self._by_service: dict[bytes, dict[bytes, Deferred]] = {}
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def num_queued(self, service: bytes) -> int:
        return len(self._by_service.get(service, ()))

    def push(self, entry: Deferred) -> None:
        self.by_id[entry.request_id] = entry
        self.num_bytes += entry.num_bytes
        self._by_service.setdefault(entry.service, {})[entry.request_id] = entry

    def remove(self, request_id: bytes) -> Deferred | None:
        entry = self.by_id.pop(request_id, None)
        if entry is not None:
            self.num_bytes -= entry.num_bytes
            queue = self._by_service[entry.service]
            del queue[request_id]
            if not queue:
                del self._by_service[entry.service]
        return entry

    def heads(self) -> Iterator[Deferred]:
        """The oldest entry of each service (a snapshot: the caller may remove entries)."""
        return iter([next(iter(queue.values())) for queue in self._by_service.values()])

    def head(self, service: bytes) -> Deferred | None:
        queue = self._by_service.get(service)
        return next(iter(queue.values())) if queue else None

    def expired(self, now: float) -> list[Deferred]:
        """Remove and return every entry whose deadline has passed."""
        late = [entry for entry in self.by_id.values() if entry.deadline <= now]
        for entry in late:
            self.remove(entry.request_id)
        return late

    def of_client(self, client: Node) -> list[Deferred]:
        return [entry for entry in self.by_id.values() if entry.client is client]
