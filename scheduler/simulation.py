"""Drive `ClusterPolicy` with simulated nodes and sessions: balance and remap figures.

Contract: `SimCluster` stands in for the broker (it calls the policy's hooks and keeps each
node's outstanding count as the broker would); `balance(...)` and `remap_on_join(...)` /
`remap_on_leave(...)` return the figures the tests assert on and docs report. At fleet sizes
(harness/bench/fleet_bench.py: 1,000 and 10,000 nodes) `ring_figures(n)` gives the ring's balance
and the key space moved by one join and one leave exactly, from the ring's arcs (sampled sessions
would need many more than n sessions to see one node's share), `decision_seconds(n)` what one
decode placement costs the broker among n nodes and `membership_seconds(n)` what a join and a
leave cost it.
`python -m scheduler.simulation` prints them (deterministic: no randomness, no clock; only
`decision_seconds` reads a clock).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from bus.constants import SERVICES_BY_ROLE
from scheduler.node_loads import DECODE_ROLES, PREFILL_ROLES
from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.ring import HashRing

PLAIN_EPSILON = 1e9   # a bound no node reaches: plain consistent hashing


@dataclass(eq=False)
class SimNode:
    node_id: str
    role: str = "decode"
    capacity: dict[str, float] = field(default_factory=dict)
    num_outstanding: int = 0
    num_assigned: int = 0


class SimCluster:
    def __init__(self, policy: ClusterPolicy, node_ids=(), role: str = "decode") -> None:
        self.policy = policy
        self.nodes: dict[str, SimNode] = {}
        self._num_requests = 0
        node_ids = list(node_ids)
        # The ring in one sort (a fleet of 10,000 in ~1 s); `on_join` then finds each node on it.
        if role in DECODE_ROLES:
            policy.ring.add_nodes(node_ids)
        if role in PREFILL_ROLES:
            policy.prefill_ring.add_nodes(node_ids)
        for node_id in node_ids:
            self.join(node_id, role)

    def join(self, node_id: str, role: str = "decode", **capacity: float) -> SimNode:
        node = self.nodes[node_id] = SimNode(node_id, role, dict(capacity))
        self.policy.on_join(node)
        return node

    def leave(self, node_id: str, reason: str = "expired") -> None:
        self.policy.on_leave(self.nodes.pop(node_id), reason)

    def report(self, node_id: str, **capacity: float) -> None:
        node = self.nodes[node_id]
        node.capacity = dict(capacity)
        self.policy.on_capacity(node)

    def request(self, service: str, key: str = "") -> SimNode:
        """Place one request (it stays outstanding until `finish`)."""
        self._num_requests += 1
        candidates = [n for n in self.nodes.values() if service in SERVICES_BY_ROLE[n.role]]
        node = self.policy.choose(service, key, f"request-{self._num_requests}", candidates)
        assert node is not None, f"no {service} node in the simulated cluster"
        node.num_outstanding += 1
        node.num_assigned += 1
        return node

    def finish_all(self) -> None:
        for node in self.nodes.values():
            node.num_outstanding = 0


def node_ids(num_nodes: int) -> list[str]:
    return [f"decode-{i}" for i in range(num_nodes)]


def session_ids(num_sessions: int, prefix: str = "session") -> list[str]:
    return [f"{prefix}-{i}" for i in range(num_sessions)]


def balance(num_nodes: int, num_sessions: int, epsilon: float = PLAIN_EPSILON, vnodes: int = 64) -> float:
    """max/mean concurrent streams per node after `num_sessions` sessions each open one stream."""
    cluster = SimCluster(ClusterPolicy(SchedulerSettings(vnodes=vnodes, epsilon=epsilon)), node_ids(num_nodes))
    for session_id in session_ids(num_sessions):
        cluster.request("decode", session_id)
    loads = [n.num_outstanding for n in cluster.nodes.values()]
    return max(loads) / statistics.mean(loads)


@dataclass(frozen=True)
class Remap:
    moved: float          # fraction of existing sessions whose next turn lands on another node
    ideal: float          # 1/(N+1) on join, 1/N on leave
    new_share: float      # join: fraction of new sessions the new node takes; leave: 0
    restart_moved: float  # a fresh policy (broker restart) on the new node set vs the old homes


def _place_idle_sessions(cluster: SimCluster, sessions: list[str]) -> dict[str, str]:
    """One turn per session, finished before the next begins (sessions idle between turns)."""
    placed = {}
    for session_id in sessions:
        placed[session_id] = cluster.request("decode", session_id).node_id
        cluster.finish_all()
    return placed


def _fresh_homes(nodes: list[str], sessions: list[str], settings: SchedulerSettings) -> dict[str, str]:
    return _place_idle_sessions(SimCluster(ClusterPolicy(settings), nodes), sessions)


def remap_on_join(num_nodes: int, num_sessions: int, settings: SchedulerSettings | None = None) -> Remap:
    settings = settings or SchedulerSettings()
    nodes, sessions = node_ids(num_nodes), session_ids(num_sessions)
    cluster = SimCluster(ClusterPolicy(settings), nodes)
    before = _place_idle_sessions(cluster, sessions)
    cluster.join("decode-new")
    after = _place_idle_sessions(cluster, sessions)
    fresh = _place_idle_sessions(cluster, session_ids(num_sessions, "new-session"))
    restarted = _fresh_homes([*nodes, "decode-new"], sessions, settings)
    return Remap(_fraction_moved(before, after), 1 / (num_nodes + 1),
                 sum(n == "decode-new" for n in fresh.values()) / num_sessions,
                 _fraction_moved(before, restarted))


def remap_on_leave(num_nodes: int, num_sessions: int, settings: SchedulerSettings | None = None) -> Remap:
    settings = settings or SchedulerSettings()
    nodes, sessions = node_ids(num_nodes), session_ids(num_sessions)
    cluster = SimCluster(ClusterPolicy(settings), nodes)
    before = _place_idle_sessions(cluster, sessions)
    cluster.leave(nodes[-1])
    after = _place_idle_sessions(cluster, sessions)
    restarted = _fresh_homes(nodes[:-1], sessions, settings)
    return Remap(_fraction_moved(before, after), 1 / num_nodes, 0.0, _fraction_moved(before, restarted))


def remap_on_join_busy(num_nodes: int, num_sessions: int, epsilon: float) -> tuple[float, float]:
    """Every session streams all the time; a node joins; each session's next turn replaces its
    stream. (fraction of sessions moved, max/mean streams per node afterwards)."""
    settings = SchedulerSettings(epsilon=epsilon)
    cluster = SimCluster(ClusterPolicy(settings), node_ids(num_nodes))
    sessions = session_ids(num_sessions)
    before = {s: cluster.request("decode", s) for s in sessions}
    cluster.join("decode-new")
    moved = 0
    for session_id in sessions:
        before[session_id].num_outstanding -= 1          # its turn ended...
        after = cluster.request("decode", session_id)   # ...and its next one starts
        moved += after is not before[session_id]
    loads = [n.num_outstanding for n in cluster.nodes.values()]
    return moved / num_sessions, max(loads) / statistics.mean(loads)


@dataclass(frozen=True)
class RingFigures:
    """Exact key-space figures of the decode ring (no sampling: what unlimited sessions converge to)."""

    num_nodes: int
    max_share: float     # the most loaded node's share of the key space / the mean share
    min_share: float     # the least loaded node's, likewise
    join_moved: float    # one node joins: the key space that changes owner (all of it goes to the new node)
    leave_moved: float   # one node leaves: its key space, spread over the others

    @property
    def join_ideal(self) -> float:
        return 1 / (self.num_nodes + 1)

    @property
    def leave_ideal(self) -> float:
        return 1 / self.num_nodes


def ring_figures(num_nodes: int, vnodes: int = 64) -> RingFigures:
    ring = HashRing(vnodes)
    ring.add_nodes(node_ids(num_nodes))
    shares = ring.shares()
    mean = 1 / num_nodes
    leave_moved = shares[node_ids(num_nodes)[-1]]
    ring.add_node("decode-new")
    return RingFigures(num_nodes, max(shares.values()) / mean, min(shares.values()) / mean,
                       ring.shares()["decode-new"], leave_moved)


def decision_seconds(num_nodes: int, num_decisions: int = 200) -> float:
    """Mean time of `ClusterPolicy.choose` for a new decode session among `num_nodes` idle nodes."""
    cluster = SimCluster(ClusterPolicy(), node_ids(num_nodes))
    candidates = list(cluster.nodes.values())
    start = time.perf_counter()
    for i in range(num_decisions):
        cluster.policy.choose("decode", f"session-{i}", f"request-{i}", candidates)
    return (time.perf_counter() - start) / num_decisions


def membership_seconds(num_nodes: int, num_changes: int = 5) -> tuple[float, float]:
    """Mean time of `ClusterPolicy.on_join` and of `on_leave` for a decode node among `num_nodes`,
    each followed by one ring lookup (the next placement): what the broker spends on a READY and
    on a node's departure, besides the messages."""
    cluster = SimCluster(ClusterPolicy(), node_ids(num_nodes))
    ring = cluster.policy.ring
    extra = [f"decode-extra-{i}" for i in range(num_changes)]
    start = time.perf_counter()
    for node_id in extra:
        cluster.join(node_id)
        ring.lookup(node_id)
    middle = time.perf_counter()
    for node_id in extra:
        cluster.leave(node_id)
        ring.lookup(node_id)
    return (middle - start) / num_changes, (time.perf_counter() - middle) / num_changes


def _fraction_moved(before: dict[str, str], after: dict[str, str]) -> float:
    return sum(before[k] != after[k] for k in before) / len(before)


def main() -> None:
    print("balance: max/mean concurrent streams per decode node (10 000 sessions)")
    for num_nodes in (4, 8, 16):
        print(f"  {num_nodes:2d} nodes  plain ring {balance(num_nodes, 10_000):.3f}"
              f"   bounded eps=0.25 {balance(num_nodes, 10_000, 0.25):.3f}"
              f"   bounded eps=0.10 {balance(num_nodes, 10_000, 0.10):.3f}")
    print("remap: fraction of existing sessions whose next turn moves (10 000 sessions)")
    for num_nodes in (4, 8):
        join, leave = remap_on_join(num_nodes, 10_000), remap_on_leave(num_nodes, 10_000)
        print(f"  join {num_nodes}->{num_nodes + 1}: sticky {join.moved:.3f}, new node's share of new"
              f" sessions {join.new_share:.3f}, after a broker restart {join.restart_moved:.3f}"
              f" (ideal {join.ideal:.3f})")
        print(f"  leave {num_nodes}->{num_nodes - 1}: sticky {leave.moved:.3f}, after a broker restart"
              f" {leave.restart_moved:.3f} (ideal {leave.ideal:.3f})")
    print("join while every session streams: fraction moved by the load bound, max/mean after one turn each")
    for epsilon in (0.25, 0.10):
        moved, ratio = remap_on_join_busy(4, 10_000, epsilon)
        print(f"  join 4->5, eps={epsilon:.2f}: moved {moved:.3f}, max/mean {ratio:.3f} (ideal move 0.200)")


if __name__ == "__main__":
    main()
