"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018).

Contract:
- `HashRing` maps keys (session ids) to node ids. Each node owns `num_vnodes` points on a 64-bit
  ring; positions come from xxh3_64 of `"{node_id}#{i}"`, so the mapping depends only on the set of
  node ids — never on insertion order or the process (a restarted broker routes as before).
- `add_node` / `remove_node` cost O(vnodes log n) (see `HashRing`); `add_nodes` adds many with one
  sort. `shares()` is the fraction of the key space each node owns: where a key-uniform load
  converges.
- `HashRing.candidates(key)` walks clockwise from the key's point and yields each distinct node once:
  the first is the key's home, the rest are the "next node on the ring" for failover and for
  decode nodes that answer "full".
- `BoundedLoadRing` adds the bound: a key goes to the first candidate whose load is below
  ceil((1 + epsilon) * mean load after placement), so no node exceeds (1+epsilon)x the mean while
  a key still lands on its home node whenever that node has room. Loads are the caller's to report.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping

import xxhash
from sortedcontainers import SortedList

_RING_SIZE = 2**64   # xxh3_64 positions
# Memory of one point: its list slot, the (point, node_id) tuple and the 64-bit int (the node id
# string is shared by its points).
RING_BYTES_PER_POINT = 8 + 56 + 36


def _point(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class HashRing:
    """Plain consistent hashing with virtual nodes.

    The ring is a `sortedcontainers.SortedList` of `(point, node_id)`: a join or a leave is
    `num_vnodes` insertions or removals of O(log n) each, because a broker sees membership in storms
    (10,000 nodes registering at once, or expiring together after a stall) and must keep answering.
    (Two parallel Python lists cost a memmove per point, 11 ms a join at 10,000 nodes; a lazy merge
    of them still copies every element, ~40 ms.) Ties between equal points are broken by node id,
    so the ring never depends on the order of joins.
    """

    def __init__(self, num_vnodes: int = 64) -> None:
        if num_vnodes < 1:
            raise ValueError("num_vnodes must be >= 1")
        self.num_vnodes = num_vnodes
        self._entries: SortedList = SortedList()   # (point, node_id)
        self._nodes: set[str] = set()

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def _vnodes(self, node_id: str) -> Iterator[tuple[int, str]]:
        return ((_point(f"{node_id}#{i}"), node_id) for i in range(self.num_vnodes))

    def add_node(self, node_id: str) -> None:
        if node_id not in self._nodes:
            self._nodes.add(node_id)
            for entry in self._vnodes(node_id):
                self._entries.add(entry)

    def add_nodes(self, node_ids: Iterable[str]) -> None:
        """`add_node` for each, with one sort."""
        new = set(node_ids) - self._nodes
        self._nodes |= new
        self._entries.update(entry for node_id in new for entry in self._vnodes(node_id))

    def remove_node(self, node_id: str) -> None:
        if node_id in self._nodes:
            self._nodes.discard(node_id)
            for entry in self._vnodes(node_id):
                self._entries.remove(entry)

    @property
    def num_points(self) -> int:
        return len(self._entries)

    def shares(self) -> dict[str, float]:
        """Fraction of the key space each node owns (a key goes to the first point after its own)."""
        owned = dict.fromkeys(self._nodes, 0)
        previous = self._entries[-1][0] - _RING_SIZE if self._entries else 0   # the wrap-around arc
        for point, owner in self._entries:
            owned[owner] += point - previous
            previous = point
        return {node_id: arc / _RING_SIZE for node_id, arc in owned.items()}

    def candidates(self, key: str) -> Iterator[str]:
        """Distinct node ids clockwise from `key`'s point: home first, then fallbacks."""
        if not self._entries:
            return
        start = self._entries.bisect_left((_point(key) + 1,))   # the first point after the key's
        seen: set[str] = set()
        for _, owner in itertools.chain(self._entries.islice(start), self._entries.islice(0, start)):
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
