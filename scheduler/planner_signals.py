"""What the planner reads: the broker's stats body turned into a validated `Snapshot`, and each
pool's load (`PoolLoad`) computed from it.

Contract (plain data: no I/O, no clock, never raises on what a peer sent):
- `parse_snapshot(body, signals=None) -> Snapshot` reads the body of `pdbus.broker.stats`
  (docs/PROTOCOL.md §1.3 item 9): `nodes_by_role`, `queued_by_service`, `capacity_by_node` and
  `role_by_node` (a broker without `role_by_node` is read by the capacity keys: `kv_blocks_total`
  or `max_running` -> decode, `max_batch_tokens` -> prefill). A node entry of the wrong shape (an
  id that is not a short string, a capacity that is not a map, a value the planner reads that is
  not a finite number >= 0, a role it cannot tell) is skipped and counted in `num_malformed`.
  A body without the three maps is `valid = False`: the planner does nothing on it.
- `NodeReport`: one serving node as the planner sees it (`draining`: leaving or switching, not
  capacity; `switchable`: may flip between prefill and decode without a restart).
- `Signals`: what the shell may add from outside the broker (SLO attainment, TTFT and TPOT p90
  over its last window, SLO outcomes by second of arrival as `ArrivalCount`s); None = unknown.
- `pool_load(snapshot, role, fallback_batch_tokens) -> PoolLoad`: the role's non-draining nodes
  and its pressure. Prefill pressure = queued prompt tokens / the nodes' summed `max_batch_tokens`
  (full batches waiting per node). Decode pressure = the higher of KV use (1 - free/total over
  nodes that report a KV budget) and stream use (running/max_running over nodes that report a
  maximum). Both are 0 for a pool with no active node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

POOL_ROLES = ("prefill", "decode")
MAX_NODE_ID_CHARS = 128
MAX_WIRE_INT = 2**64 - 1
# Capacity names the planner reads; any other name (px.<hash>, counters) is left unread.
READ_KEYS = ("kv_blocks_total", "kv_blocks_free", "max_running", "num_running", "full",
             "queued_tokens", "max_batch_tokens", "draining", "switchable")


@dataclass(frozen=True, slots=True)
class NodeReport:
    node_id: str
    role: str                       # "prefill", "decode" or "both" (colocated: in neither pool)
    values: Mapping[str, float]     # the READ_KEYS it reported (missing: 0)

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)

    @property
    def draining(self) -> bool:
        return self.get("draining") > 0

    @property
    def switchable(self) -> bool:
        return self.get("switchable") > 0


@dataclass(frozen=True, slots=True)
class ArrivalCount:
    """The requests that arrived in one second whose SLO outcome is known."""
    at: float      # the second's start, on the planner's clock
    within: int
    missed: int
    credit: float  # within + the share of the targets each miss met (0 <= credit - within <= missed)


@dataclass(frozen=True, slots=True)
class Signals:
    slo_attainment: float | None = None   # fraction of requests within their SLO, last window
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    arrivals: tuple[ArrivalCount, ...] | None = None   # outcomes by second of arrival (None: unknown)


@dataclass(frozen=True, slots=True)
class Snapshot:
    valid: bool
    nodes: tuple[NodeReport, ...] = ()
    nodes_by_role: Mapping[str, int] = field(default_factory=dict)
    queued_by_service: Mapping[str, int] = field(default_factory=dict)
    num_malformed: int = 0
    signals: Signals = Signals()

    def node(self, node_id: str) -> NodeReport | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def of_role(self, role: str) -> tuple[NodeReport, ...]:
        return tuple(n for n in self.nodes if n.role == role)


@dataclass(frozen=True, slots=True)
class PoolLoad:
    role: str
    active: tuple[NodeReport, ...]   # not draining: the pool's capacity
    pressure: float
    queued: int                      # requests of this service waiting at the broker

    @property
    def size(self) -> int:
        return len(self.active)


def _is_count(value: object) -> bool:
    """A finite number >= 0 (ints past 64 bits too: no wire value is one, and float() of one overflows)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 <= value <= MAX_WIRE_INT
    return isinstance(value, float) and math.isfinite(value) and value >= 0


def _counts(value: object) -> dict[str, int] | None:
    """A map of names to whole counts, or None when it is not one (bad entries dropped)."""
    if not isinstance(value, dict):
        return None
    return {k: int(v) for k, v in value.items() if isinstance(k, str) and _is_count(v)}


def _read_values(capacity: object) -> dict[str, float] | None:
    if not isinstance(capacity, dict):
        return None
    values: dict[str, float] = {}
    for name in READ_KEYS:
        if name in capacity:
            if not _is_count(capacity[name]):
                return None
            values[name] = float(capacity[name])
    return values


def _role_of(node_id: str, values: Mapping[str, float], roles: object) -> str | None:
    if isinstance(roles, dict):
        role = roles.get(node_id)
        return role if isinstance(role, str) and role in ("prefill", "decode", "both") else None
    if "kv_blocks_total" in values or "max_running" in values:
        return "decode"
    return "prefill" if "max_batch_tokens" in values else None


def _read_node(node_id: object, capacity: object, roles: object) -> NodeReport | None:
    if not isinstance(node_id, str) or not 0 < len(node_id) <= MAX_NODE_ID_CHARS:
        return None
    values = _read_values(capacity)
    if values is None:
        return None
    role = _role_of(node_id, values, roles)
    return NodeReport(node_id, role, values) if role else None


def parse_snapshot(body: object, signals: Signals | None = None) -> Snapshot:
    """The broker's stats body as a Snapshot; never raises (see the module docstring)."""
    signals = signals or Signals()
    if not isinstance(body, dict):
        return Snapshot(valid=False, num_malformed=1, signals=signals)
    by_role, queued = _counts(body.get("nodes_by_role")), _counts(body.get("queued_by_service"))
    capacities, roles = body.get("capacity_by_node"), body.get("role_by_node")
    if by_role is None or queued is None or not isinstance(capacities, dict):
        return Snapshot(valid=False, num_malformed=1, signals=signals)
    nodes = [_read_node(node_id, capacity, roles) for node_id, capacity in capacities.items()]
    good = tuple(sorted((n for n in nodes if n is not None), key=lambda n: n.node_id))
    return Snapshot(True, good, by_role, queued, len(nodes) - len(good), signals)


def prefill_pressure(active: tuple[NodeReport, ...], fallback_batch_tokens: int) -> float:
    """Full batches of prompt tokens waiting per prefill node."""
    batch_tokens = sum(n.get("max_batch_tokens") or fallback_batch_tokens for n in active)
    return sum(n.get("queued_tokens") for n in active) / batch_tokens if active else 0.0


def decode_pressure(active: tuple[NodeReport, ...]) -> float:
    """The higher of KV use and stream use across the decode nodes (0..1, a report may exceed 1)."""
    total = sum(n.get("kv_blocks_total") for n in active)
    free = sum(min(n.get("kv_blocks_free"), n.get("kv_blocks_total")) for n in active)
    max_running = sum(n.get("max_running") for n in active)
    running = sum(n.get("num_running") for n in active if n.get("max_running") > 0)
    kv_use = 1.0 - free / total if total > 0 else 0.0
    stream_use = running / max_running if max_running > 0 else 0.0
    return max(kv_use, stream_use)


def pool_load(snapshot: Snapshot, role: str, fallback_batch_tokens: int) -> PoolLoad:
    active = tuple(n for n in snapshot.of_role(role) if not n.draining)
    pressure = prefill_pressure(active, fallback_batch_tokens) if role == "prefill" else decode_pressure(active)
    return PoolLoad(role, active, pressure, snapshot.queued_by_service.get(role, 0))


def node_load(node: NodeReport) -> tuple[float, float, str]:
    """How busy one node is, for picking the idlest (ties: node id, so the pick is deterministic)."""
    if node.role == "prefill":
        return node.get("queued_tokens"), 0.0, node.node_id
    used = node.get("kv_blocks_total") - min(node.get("kv_blocks_free"), node.get("kv_blocks_total"))
    return node.get("num_running"), used, node.node_id


def parse_signals(values: Mapping[str, Any]) -> Signals:
    """Signals from a loose map (e.g. a scrape); a value that is not a finite number >= 0 is unknown."""
    def read(name: str) -> float | None:
        value = values.get(name)
        return float(value) if isinstance(value, int | float) and _is_count(value) else None
    return Signals(read("slo_attainment"), read("ttft_p90_s"), read("tpot_p90_s"))
