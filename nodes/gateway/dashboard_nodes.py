"""The dashboard's node table, from the broker's stats answer (`pdbus.broker.stats`), pure.

Contract: `table = NodeTable(forget_after_s=60.0)`; `table.update(stats, now) -> list[NodeEvent]`
with each stats answer (`None` when the broker did not answer: the table keeps what it knew and
`broker_ok` turns false); `table.rows(now) -> list[dict]` (JSON-ready, sorted by role then id) and
`table.totals() -> Totals` (the cluster's running streams, queued requests, decode KV use).

What the broker reports (bus/broker_routes.py `stats()`): `nodes_by_role` (every registered peer,
gateways included), `queued_by_service` (its bounded wait queue), `role_by_node` and
`capacity_by_node` (serving nodes only, each node's last capacity report: nodes/decode_node.py,
prefill_node.py, node_lifecycle.py). A node the broker no longer lists was declared dead (its
liveness window passed) or left: the table keeps it as `lost` for `forget_after_s`, so a failover
stays visible on the page, and says so once as a `node_lost` event; a node that appears after the
first answer is a `node_joined` event. Every value is a peer's report: numbers are read only when
finite and non-negative, names are cut to 128 characters, so a hostile node can skew its own row
but not break the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_NAME = 128
# Capacity keys shown per node (nodes/decode_node.py, prefill_node.py, node_lifecycle.py); the rest
# (prefix holdings `px.*`, buffer sizes) stays off the page.
SHOWN_KEYS = ("kv_blocks_total", "kv_blocks_free", "kv_blocks_cached", "num_running", "max_running", "full",
              "queued_tokens", "max_batch_tokens", "num_prefilled", "prompt_tokens", "prefix_cached_tokens",
              "draining", "switchable")


@dataclass(frozen=True, slots=True)
class NodeEvent:
    kind: str      # "node_joined" | "node_lost"
    node_id: str
    role: str
    at: float


@dataclass
class Totals:
    num_running: float = 0.0
    num_queued: float = 0.0
    kv_blocks_used: float = 0.0
    kv_blocks_total: float = 0.0

    @property
    def kv_used(self) -> float | None:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else None


@dataclass
class _Node:
    role: str
    capacity: dict[str, float]
    last_seen: float
    lost_at: float | None = None


def number(value: Any) -> float | None:
    """A finite, non-negative number from a peer's report, else None (bools are not numbers)."""
    if type(value) is bool or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def counts(value: Any) -> dict[str, float]:
    """A {name: count} map of the broker's answer; anything else is empty."""
    if not isinstance(value, dict):
        return {}
    found = {str(name)[:MAX_NAME]: number(count) for name, count in value.items()}
    return {name: count for name, count in found.items() if count is not None}


def _a_map(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _capacity(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    found = {key: number(value.get(key)) for key in SHOWN_KEYS}
    return {key: count for key, count in found.items() if count is not None}


@dataclass
class NodeTable:
    forget_after_s: float = 60.0
    nodes: dict[str, _Node] = field(default_factory=dict)
    roles: dict[str, float] = field(default_factory=dict)
    queued: dict[str, float] = field(default_factory=dict)
    broker_ok: bool = False
    num_routes: float | None = None
    _answered_once: bool = False

    def update(self, stats: dict[str, Any] | None, now: float) -> list[NodeEvent]:
        if stats is None:
            self.broker_ok = False
            return []
        self.broker_ok = True
        self.roles, self.queued = counts(stats.get("nodes_by_role")), counts(stats.get("queued_by_service"))
        self.num_routes = number(stats.get("num_routes"))
        roles, capacities = _a_map(stats.get("role_by_node")), _a_map(stats.get("capacity_by_node"))
        events = self._seen(roles, capacities, now)
        events += self._lost(set(str(node_id)[:MAX_NAME] for node_id in roles), now)
        self._answered_once = True
        return events

    def _seen(self, roles: dict, capacities: dict, now: float) -> list[NodeEvent]:
        events = []
        for raw_id, raw_role in roles.items():
            node_id, role = str(raw_id)[:MAX_NAME], str(raw_role)[:MAX_NAME]
            known = self.nodes.get(node_id)
            if (known is None or known.lost_at is not None) and self._answered_once:
                events.append(NodeEvent("node_joined", node_id, role, now))
            self.nodes[node_id] = _Node(role, _capacity(capacities.get(raw_id)), now)
        return events

    def _lost(self, present: set[str], now: float) -> list[NodeEvent]:
        events = []
        for node_id, node in list(self.nodes.items()):
            if node_id in present:
                continue
            if node.lost_at is None:
                node.lost_at = now
                events.append(NodeEvent("node_lost", node_id, node.role, now))
            elif now - node.lost_at > self.forget_after_s:
                del self.nodes[node_id]   # long gone: ids that come and go do not pile up
        return events

    def rows(self, now: float) -> list[dict[str, Any]]:
        return [self._row(node_id, node, now)
                for node_id, node in sorted(self.nodes.items(), key=lambda item: (item[1].role, item[0]))]

    def _row(self, node_id: str, node: _Node, now: float) -> dict[str, Any]:
        cap = node.capacity
        row: dict[str, Any] = {"id": node_id, "role": node.role, "state": self._state(node),
                               "seen_ago_s": round(now - node.last_seen, 1), **cap}
        if cap.get("kv_blocks_total"):
            row["kv_used"] = round(1 - min(cap.get("kv_blocks_free", 0.0), cap["kv_blocks_total"])
                                   / cap["kv_blocks_total"], 4)
        if cap.get("prompt_tokens"):
            row["prefix_hit"] = round(cap.get("prefix_cached_tokens", 0.0) / cap["prompt_tokens"], 4)
        return row

    def _state(self, node: _Node) -> str:
        if node.lost_at is not None:
            return "lost"
        if not self.broker_ok:
            return "unknown"   # the broker did not answer: last known values, no verdict
        if node.capacity.get("draining"):
            return "draining"
        return "full" if node.capacity.get("full") else "live"

    def totals(self) -> Totals:
        totals = Totals(num_queued=sum(self.queued.values()))
        for node in self.nodes.values():
            if node.lost_at is not None:
                continue
            cap = node.capacity
            totals.num_running += cap.get("num_running", 0.0)
            if cap.get("kv_blocks_total"):
                totals.kv_blocks_total += cap["kv_blocks_total"]
                totals.kv_blocks_used += cap["kv_blocks_total"] - min(cap.get("kv_blocks_free", 0.0),
                                                                      cap["kv_blocks_total"])
        return totals
