"""The scheduler's view of the live nodes: which serve decode (on the hash ring) and prefill, and
how loaded each is, from the capacity they report plus what the scheduler itself placed since.

Contract: plain data, no I/O. Nodes are read through `NodeView` (the broker's `bus.broker_tables.Node`
satisfies it; tests use small fakes). Capacity keys are those of docs/CLUSTER.md:
- decode: `kv_blocks_total`, `kv_blocks_free`, `block_size`, `max_running`, `num_running`;
- prefill: `max_batch_tokens`, `queued_tokens`.
A decode node is **full** when it says so (`full` > 0: a node that refuses a request for want of
room, e.g. a long prompt, sets it in the CAPACITY it sends before its ERROR `full`, and clears it
when blocks free), when it reports a KV budget (`kv_blocks_total` > 0) with fewer than
`min_free_blocks` free, or when it reports `max_running` > 0 and runs (by its report or by the
streams the broker has routed to it and not seen finish, whichever is higher) that many. A node
that reports no budget (0 or missing, e.g. an idle test node) is never full.
A node is **draining** (`is_draining`) while it reports `draining` > 0: it is leaving or switching
role, finishing what it runs; the policy routes nothing new to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

DECODE_ROLES = frozenset({"decode", "both"})
PREFILL_ROLES = frozenset({"prefill", "both"})


class NodeView(Protocol):
    node_id: str
    role: str
    capacity: dict[str, float]
    num_assigned: int

    @property
    def num_outstanding(self) -> int: ...


def is_draining(capacity: Mapping[str, float]) -> bool:
    return capacity.get("draining", 0) > 0


def decode_is_full(capacity: Mapping[str, float], num_outstanding: int, min_free_blocks: int = 1) -> bool:
    if capacity.get("full", 0) > 0:
        return True
    if capacity.get("kv_blocks_total", 0) > 0 and capacity.get("kv_blocks_free", 0) < min_free_blocks:
        return True
    max_running = capacity.get("max_running", 0)
    return max_running > 0 and max(capacity.get("num_running", 0), num_outstanding) >= max_running


def decode_load(node: NodeView) -> int:
    """Streams on a decode node, for the ring's load bound: the streams this broker routed there
    and has not seen finish, or the node's own report (`num_running`) when higher — with several
    brokers each sees only its own streams, and the report counts all of them."""
    return max(node.num_outstanding, int(node.capacity.get("num_running", 0)))


class PrefillLoads:
    """Outstanding prefill tokens per node: the last reported `queued_tokens` plus the tokens the
    scheduler routed there since that report (so a burst between two reports still spreads)."""

    def __init__(self) -> None:
        self._routed_since_report: dict[str, int] = {}

    def outstanding_tokens(self, node: NodeView) -> int:
        return int(node.capacity.get("queued_tokens", 0)) + self._routed_since_report.get(node.node_id, 0)

    def add(self, node_id: str, num_tokens: int) -> None:
        self._routed_since_report[node_id] = self._routed_since_report.get(node_id, 0) + num_tokens

    def on_report(self, node_id: str) -> None:
        self._routed_since_report.pop(node_id, None)

    def forget(self, node_id: str) -> None:
        self._routed_since_report.pop(node_id, None)
