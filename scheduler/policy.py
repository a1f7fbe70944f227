"""`ClusterPolicy`: the broker's `bus.routing.RoutingPolicy` for the disaggregated cluster.

Contract (docs/CLUSTER.md "Services, keys and capacity"):
- `decode` requests, keyed by session id: a session stays on the node that holds it while that
  node lives, is not full and is not over the load bound (sticky: its cached KV is there). Over
  the bound means (1+epsilon)x the mean number of streams (those this broker routed there, or
  the node's `num_running` report when higher: other brokers' streams) and more than
  `sticky_slack_streams` above the idlest node: old sessions cannot pile onto one node, and a
  stream or two of imbalance at low load never costs a session its cache. A
  new (or orphaned, or displaced) session goes to the first node clockwise from its key on a
  `BoundedLoadRing` that is not full and under that bound; if every non-full node is at the
  bound the first non-full candidate takes it. Full (see `scheduler.node_loads`) everywhere
  -> `Defer` into the broker's bounded queue; with `queue_size` 0 -> `Refuse("overloaded")`.
  A request without a key is placed by its request id and not remembered.
- `prefill` requests, keyed `"<tokens>[.<h1>.<h2>.<h4>...]"` (scheduler.prefill_keys: the route
  hashes of the prompt's prefixes of 1, 2, 4, ... 64 blocks). A node is under the load bound while
  its outstanding prefill tokens (reported `queued_tokens` plus tokens routed since the report) are
  below max((1+epsilon)x the mean, the idlest node's + `prefill_affinity_slack_tokens`). Among
  nodes under the bound, the one that reports (`px.<hash>` capacity names, scheduler.prefix_hashes)
  the deepest of the request's hashes wins: its cache holds the longest prefix of the prompt
  (ties: fewer outstanding tokens, then the rules below). With no reported match (the
  cheap default): the first node under the bound clockwise from the deepest hash on a
  consistent-hash ring of the prefill nodes (its home, or the next). When every node is over the
  bound, and for keys without a hash, the node with the fewest outstanding tokens. A request's
  tokens are the key's length, else `prefill_tokens_estimate`. Ties: fewer outstanding requests,
  then fewer requests ever, then node id (deterministic). Reports are indexed as they arrive
  (`on_join`/`on_capacity`, dropped `on_leave`): hash -> reporting nodes, at most
  `MAX_REPORTED_PREFIXES` hashes a node, so a choice reads only the request's hashes' holders.
  No prefill node at all never reaches the policy: the broker answers `no_node` and counts it
  as `rejected.no_node.prefill` (clients then fall back to decode-local prefill).
- A draining node (`draining` in its capacity: leaving or switching role) is never chosen; its
  sessions move as from a full node (`skipped_draining` counts the nodes passed over). Every
  decode candidate draining -> `Defer`, as when all are full (a replacement or the switched node
  will take it); every prefill candidate draining -> no node (`no_node`: the client prefills on
  its decode node).
- Any other service: fewest outstanding requests (the bus default).
- Deterministic: placements depend only on the node ids, their loads and capacity, and the
  sessions seen, never on join order or the process (xxh3 positions), so a restarted broker
  with the same nodes places new sessions as before.
- `metrics` (a Counter): `placed.<service>.<node_id>` (dropped when the node leaves, so node
  ids that come and go do not grow it); `sessions.new|sticky|moved|returned|
  orphaned|over_bound`; `prefill.prefix_reported` (choices a reported match made),
  `prefill.prefix_home|prefix_next|prefix_spread|least_loaded`; `decode.skipped_full` (full nodes
  passed over), `decode.all_full` (choices that found every node full, re-offers of a queued
  request included), `decode.overloaded` (refusals when there is no queue). The broker counts
  the requests themselves (`queue.*`, `rejected.*`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from bus.constants import ErrorCode
from bus.routing import Defer, Refuse
from scheduler.node_loads import (
    DECODE_ROLES,
    PREFILL_ROLES,
    NodeView,
    PrefillLoads,
    decode_is_full,
    decode_load,
    is_draining,
)
from scheduler.prefill_keys import parse_prefill_key
from scheduler.prefix_hashes import reported_hashes
from scheduler.ring import BoundedLoadRing, HashRing
from scheduler.sessions import SessionTable

N = TypeVar("N", bound=NodeView)   # the broker's nodes, or the simulation's: `choose` returns one of its own


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """`[scheduler]` of the cluster config (unknown keys, e.g. `local_suffix_tokens`, are the nodes')."""

    vnodes: int = 64
    epsilon: float = 0.25
    queue_size: int = 64
    queue_timeout_s: float = 30.0
    retry_after_s: float = 1.0
    min_free_blocks: int = 1
    sticky_slack_streams: int = 4
    prefill_tokens_estimate: int = 256
    prefill_affinity_slack_tokens: int = 2048   # a prefix keeps its node up to this far above the idlest
    max_sessions: int = 100_000

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> SchedulerSettings:
        known = {f.name: f.type for f in fields(cls)}
        chosen: dict[str, Any] = {name: (float if kind == "float" else int)(values[name])
                  for name, kind in known.items() if name in values}
        settings = cls(**chosen)
        if settings.queue_size < 0 or settings.queue_timeout_s <= 0 or settings.retry_after_s < 0:
            raise ValueError("[scheduler] queue_size >= 0, queue_timeout_s > 0, retry_after_s >= 0")
        return settings


class PrefixIndex:
    """Which prefill nodes report holding which prefix hashes: hash -> node ids, and per node the
    hashes it reported last (at most MAX_REPORTED_PREFIXES), so an update costs O(its names)."""

    def __init__(self) -> None:
        self.by_node: dict[str, frozenset[str]] = {}
        self.holders_of: dict[str, set[str]] = {}

    def update(self, node_id: str, hashes: Iterable[str]) -> None:
        new = frozenset(hashes)
        old = self.by_node.get(node_id, frozenset())
        if new == old:
            return
        for gone in old - new:
            self._drop(gone, node_id)
        for added in new - old:
            self.holders_of.setdefault(added, set()).add(node_id)
        if new:
            self.by_node[node_id] = new
        else:
            self.by_node.pop(node_id, None)

    def forget(self, node_id: str) -> None:
        self.update(node_id, ())

    def holders(self, prefix_hash: str) -> set[str]:
        return self.holders_of.get(prefix_hash, set())

    def _drop(self, prefix_hash: str, node_id: str) -> None:
        holders = self.holders_of[prefix_hash]
        holders.discard(node_id)
        if not holders:
            del self.holders_of[prefix_hash]


class ClusterPolicy:
    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self.settings = settings or SchedulerSettings()
        self.ring = BoundedLoadRing(self.settings.vnodes, self.settings.epsilon)
        self.sessions = SessionTable(self.settings.max_sessions)
        self.prefill_loads = PrefillLoads()
        self.prefill_ring = HashRing(self.settings.vnodes)   # prefill nodes, by prompt prefix
        self.prefixes = PrefixIndex()                        # what prefill nodes report they cache
        self.metrics: Counter[str] = Counter()

    # -- registry events -----------------------------------------------------------------

    def on_join(self, node: NodeView) -> None:
        if node.role in DECODE_ROLES:
            self.ring.add_node(node.node_id)
        if node.role in PREFILL_ROLES:
            self.prefill_ring.add_node(node.node_id)
            self.prefixes.update(node.node_id, reported_hashes(node.capacity))

    def on_leave(self, node: NodeView, reason: str) -> None:
        for service in ("decode", "prefill", "both"):
            self.metrics.pop(f"placed.{service}.{node.node_id}", None)
        if node.role in DECODE_ROLES:
            self.ring.remove_node(node.node_id)
            self.metrics["sessions.orphaned"] += self.sessions.node_left(node.node_id)
        self.prefill_loads.forget(node.node_id)
        self.prefill_ring.remove_node(node.node_id)
        self.prefixes.forget(node.node_id)

    def on_capacity(self, node: NodeView) -> None:
        self.prefill_loads.on_report(node.node_id)
        if node.role in PREFILL_ROLES:
            self.prefixes.update(node.node_id, reported_hashes(node.capacity))

    # -- placement -----------------------------------------------------------------------

    def choose(self, service: str, key: str, request_id: str, candidates: Sequence[N]) -> N | None:
        serving = [n for n in candidates if not is_draining(n.capacity)]
        self.metrics["skipped_draining"] += len(candidates) - len(serving)
        if not serving and service == "decode" and candidates:
            raise self._all_full(len(candidates))
        if not serving:
            return None
        draining = frozenset(n.node_id for n in candidates if is_draining(n.capacity)) if len(serving) < len(
            candidates) else frozenset()
        candidates = serving
        if service == "decode":
            node = self._choose_decode(key or request_id, bool(key), candidates, draining)
        elif service == "prefill":
            node = self._choose_prefill(key, candidates)
        else:
            node = min(candidates, key=lambda n: (n.num_outstanding, n.num_assigned, n.node_id))
        if node is not None:
            self.metrics[f"placed.{service}.{node.node_id}"] += 1
        return node

    def _choose_decode(self, key: str, is_session: bool, candidates: Sequence[N],
                       draining: frozenset[str] = frozenset()) -> N | None:
        live = {n.node_id: n for n in candidates if n.node_id in self.ring}
        if not live:   # only if a node joined before this policy was attached: no_node, not "full"
            return None
        full = frozenset(node_id for node_id, n in live.items() if self._is_full(n))
        self.metrics["decode.skipped_full"] += len(full)
        if len(full) == len(live):
            raise self._all_full(len(live))
        loads = {node_id: decode_load(n) for node_id, n in live.items()}
        home = self.sessions.node_of(key) if is_session else None
        if home in live and home not in full:
            if not self._over_bound(home, loads):
                self.metrics["sessions.sticky"] += 1
                return live[home]
            self.metrics["sessions.over_bound"] += 1
        # A draining node is still on the ring (its sessions move as it leaves) but is no candidate.
        node_id = self.ring.place(key, loads, exclude=full | draining
                                  ) or next(i for i in self.ring.candidates(key) if i in live and i not in full)
        if is_session:
            known = self.sessions.get(key) is not None
            moved = self.sessions.place(key, node_id)
            self.metrics["sessions.moved" if moved else "sessions.new" if not known else "sessions.returned"] += 1
        return live[node_id]

    def _over_bound(self, node_id: str, loads: dict[str, int]) -> bool:
        """Too busy to keep a session for its cached KV: over the ring's bound and more than
        `sticky_slack_streams` above the idlest node (no churn over a stream or two at low load)."""
        load = loads[node_id]
        return (load >= self.ring.capacity(sum(loads.values()))
                and load - min(loads.values()) > self.settings.sticky_slack_streams)

    def _is_full(self, node: NodeView) -> bool:
        return decode_is_full(node.capacity, node.num_outstanding, self.settings.min_free_blocks)

    def _all_full(self, num_nodes: int) -> Exception:
        settings = self.settings
        message = f"all {num_nodes} decode nodes are full"
        if settings.queue_size == 0:
            self.metrics["decode.overloaded"] += 1
            return Refuse(ErrorCode.OVERLOADED, message, retry_after_s=settings.retry_after_s)
        self.metrics["decode.all_full"] += 1
        return Defer(settings.queue_size, settings.queue_timeout_s, settings.retry_after_s, message)

    def _choose_prefill(self, key: str, candidates: Sequence[N]) -> N:
        num_tokens, hashes = parse_prefill_key(key)
        live = {n.node_id: n for n in candidates}
        outstanding = {node_id: self.prefill_loads.outstanding_tokens(n) for node_id, n in live.items()}

        def order(i: str) -> tuple[int, int, int, str]:
            return outstanding[i], live[i].num_outstanding, live[i].num_assigned, i

        node_id = self._place_prefix(hashes, outstanding, order) if hashes else None
        if node_id is None:
            self.metrics["prefill.prefix_spread" if hashes else "prefill.least_loaded"] += 1
            node_id = min(live, key=order)
        self.prefill_loads.add(node_id, num_tokens if num_tokens is not None else self.settings.prefill_tokens_estimate)
        return live[node_id]

    def _place_prefix(self, hashes: Sequence[str], outstanding: dict[str, int],
                      order: Callable[[str], tuple[int, int, int, str]]) -> str | None:
        """The node under the load bound with the deepest reported match, else the ring's choice
        for the deepest hash, else None (every node is over the bound)."""
        bound = self._prefill_bound(outstanding)
        reported = self._deepest_holder(hashes, outstanding, bound, order)
        if reported is not None:
            self.metrics["prefill.prefix_reported"] += 1
            return reported
        ring = self._ring_choice(hashes[-1], outstanding, bound)
        if ring is None:
            return None
        self.metrics["prefill.prefix_home" if ring[1] == 0 else "prefill.prefix_next"] += 1
        return ring[0]

    def _prefill_bound(self, outstanding: dict[str, int]) -> float:
        mean = sum(outstanding.values()) / len(outstanding)
        return max((1 + self.settings.epsilon) * mean,
                   min(outstanding.values()) + self.settings.prefill_affinity_slack_tokens)

    def _ring_choice(self, prefix_hash: str, outstanding: dict[str, int], bound: float) -> tuple[str, int] | None:
        """The first live node clockwise from the hash under the bound, with its rank among the live."""
        live = (i for i in self.prefill_ring.candidates(prefix_hash) if i in outstanding)
        return next(((node_id, rank) for rank, node_id in enumerate(live) if outstanding[node_id] < bound), None)

    def _deepest_holder(self, hashes: Sequence[str], outstanding: dict[str, int], bound: float,
                        order: Callable[[str], tuple[int, int, int, str]]) -> str | None:
        """The node under the bound that reports the deepest of `hashes` (`order` breaks ties)."""
        for prefix_hash in reversed(hashes):
            eligible = [i for i in self.prefixes.holders(prefix_hash) if i in outstanding and outstanding[i] < bound]
            if eligible:
                return min(eligible, key=order)
        return None
