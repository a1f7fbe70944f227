"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

Contract:
- `HashRing` maps keys (session ids) to node ids. Each node owns `num_vnodes` points on a 64-bit
  ring; positions come from xxh3_64 of `"{node_id}#{i}"`, so the mapping depends only on the set of
  node ids — never on insertion order or the process (a restarted broker routes as before).
- `HashRing.add_nodes(node_ids)` adds many nodes with one sort (the same ring as `add_node` one by
  one, which inserts each point into a sorted list: quadratic, ~60 s for 10,000 nodes).
  `shares()` is the fraction of the key space each node owns: where a key-uniform load converges.
- `HashRing.candidates(key)` walks clockwise from the key's point and yields each distinct node once:
  the first is the key's home, the rest are the "next node on the ring" for failover and for
  decode nodes that answer "full".
- `BoundedLoadRing` adds the bound: a key goes to the first candidate whose load is below
  ceil((1 + epsilon) * mean load after placement), so no node exceeds (1+epsilon)x the mean while
  a key still lands on its home node whenever that node has room. Loads are the caller's to report.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping

import xxhash

_RING_SIZE = 2**64   # xxh3_64 positions


def _point(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class HashRing:
    """Plain consistent hashing with virtual nodes."""

    def __init__(self, num_vnodes: int = 64) -> None:
        if num_vnodes < 1:
            raise ValueError("num_vnodes must be >= 1")
        self.num_vnodes = num_vnodes
        self._points: list[int] = []
        self._owners: list[str] = []
        self._nodes: set[str] = set()

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def add_node(self, node_id: str) -> None:
        if node_id in self._nodes:
            return
        self._nodes.add(node_id)
        for i in range(self.num_vnodes):
            point = _point(f"{node_id}#{i}")
            index = bisect.bisect_left(self._points, point)
            # Ties between two nodes' points are broken by node id, so order of joins never matters.
            while (index < len(self._points) and self._points[index] == point
                   and self._owners[index] < node_id):
                index += 1
            self._points.insert(index, point)
            self._owners.insert(index, node_id)

    def add_nodes(self, node_ids: Iterable[str]) -> None:
        """`add_node` for each, with one sort: (point, owner) order is `add_node`'s tie-break."""
        new = set(node_ids) - self._nodes
        if not new:
            return
        self._nodes |= new
        points = sorted([*zip(self._points, self._owners, strict=True),
                         *((_point(f"{node_id}#{i}"), node_id) for node_id in new for i in range(self.num_vnodes))])
        self._points = [point for point, _ in points]
        self._owners = [owner for _, owner in points]

    def shares(self) -> dict[str, float]:
        """Fraction of the key space each node owns (a key goes to the first point after its own)."""
        owned = dict.fromkeys(self._nodes, 0)
        previous = self._points[-1] - _RING_SIZE if self._points else 0   # the wrap-around arc
        for point, owner in zip(self._points, self._owners, strict=True):
            owned[owner] += point - previous
            previous = point
        return {node_id: arc / _RING_SIZE for node_id, arc in owned.items()}

    def remove_node(self, node_id: str) -> None:
        if node_id not in self._nodes:
            return
        self._nodes.discard(node_id)
        # Each of its points is found by bisection and deleted where it is (64 deletions), not by
        # rebuilding both lists: a leave at 10,000 nodes took ~100 ms that way, stalling the broker.
        for i in range(self.num_vnodes):
            point = _point(f"{node_id}#{i}")
            index = bisect.bisect_left(self._points, point)
            while self._owners[index] != node_id:   # ties: other nodes' equal points first
                index += 1
            del self._points[index]
            del self._owners[index]

    def candidates(self, key: str) -> Iterator[str]:
        """Distinct node ids clockwise from `key`'s point: home first, then fallbacks."""
        if not self._points:
            return
        start = bisect.bisect_right(self._points, _point(key))
        seen: set[str] = set()
        num_points = len(self._points)
        for offset in range(num_points):
            owner = self._owners[(start + offset) % num_points]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self._nodes):
                    return

    def lookup(self, key: str) -> str | None:
        """The key's home node, or None on an empty ring."""
        return next(self.candidates(key), None)


class BoundedLoadRing(HashRing):
    """Consistent hashing whose placements keep every node within (1+epsilon)x the mean load."""

    def __init__(self, num_vnodes: int = 64, epsilon: float = 0.25) -> None:
        super().__init__(num_vnodes)
        if epsilon <= 0:
            raise ValueError("epsilon must be > 0")
        self.epsilon = epsilon

    def capacity(self, total_load: int) -> int:
        """Most load any node may hold once one more unit is placed."""
        num_nodes = max(len(self), 1)
        return max(1, math.ceil((1 + self.epsilon) * (total_load + 1) / num_nodes))

    def place(self, key: str, loads: Mapping[str, int], *, exclude: frozenset[str] = frozenset()
              ) -> str | None:
        """The first candidate of `key`, not in `exclude`, with load below the bound."""
        live_loads = {node: loads.get(node, 0) for node in self._nodes}
        bound = self.capacity(sum(live_loads.values()))
        for node_id in self.candidates(key):
            if node_id not in exclude and live_loads[node_id] < bound:
                return node_id
        return None
