"""The broker's pluggable routing policy: which live node serves a request for a service.

Contract (the seam the cluster scheduler plugs into the broker):
- `on_join(node)`, `on_leave(node, reason)`, `on_capacity(node)`: registry changes, called by
  `BrokerCore` synchronously, after its own tables are updated (on_leave: before the node's
  requests are failed).
- `choose(service, key, request_id, candidates) -> Node | None`: pick a node for a REQUEST;
  `candidates` are the live nodes whose role serves `service` (never empty); `key` is the
  request's opaque routing key (e.g. a session id, "" when absent). None -> the client gets
  ERROR `no_node`; raising `Refuse(code, message, **details)` sends that ERROR instead (e.g.
  `overloaded` with a `retry_after_s` hint); raising `Defer(...)` makes the broker hold the
  request in a bounded FIFO queue per service and offer it to `choose` again when a node joins
  or reports capacity, and on every timer tick; the client gets ERROR `overloaded` (details
  `retry_after_s`) when that queue is full or the request waited `timeout_s`. A queued request
  is offered again with the same arguments; deferring it again keeps it at the queue's head.
  Called on the hot path: O(candidates) or better.
Nodes are `bus.broker_tables.Node` objects owned by the broker: read them, never mutate them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bus.broker_tables import Node


class Refuse(Exception):
    """Raised by `choose` to answer the client with ERROR `code` (and `details`)."""

    def __init__(self, code: str, message: str = "", **details: object) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.details = code, message, details


class Defer(Exception):
    """Raised by `choose` to hold the request until capacity frees (see the module docstring)."""

    def __init__(self, max_queued: int, timeout_s: float, retry_after_s: float,
                 message: str = "no capacity") -> None:
        super().__init__(message)
        self.max_queued, self.timeout_s = max_queued, timeout_s
        self.retry_after_s, self.message = retry_after_s, message


class RoutingPolicy(Protocol):
    def on_join(self, node: Node) -> None: ...

    def on_leave(self, node: Node, reason: str) -> None: ...

    def on_capacity(self, node: Node) -> None: ...

    def choose(self, service: str, key: str, request_id: str, candidates: Sequence[Node]) -> Node | None: ...


class LeastOutstandingPolicy:
    """The default: the candidate with the fewest unfinished requests; ties go to the one that
    was given the fewest requests overall, which spreads a burst round-robin."""

    def on_join(self, node: Node) -> None:
        pass

    def on_leave(self, node: Node, reason: str) -> None:
        pass

    def on_capacity(self, node: Node) -> None:
        pass

    def choose(self, service: str, key: str, request_id: str, candidates: Sequence[Node]) -> Node | None:
        return min(candidates, key=lambda n: (len(n.serving), n.num_assigned))
