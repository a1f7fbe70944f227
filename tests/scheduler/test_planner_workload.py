"""The planner against a small simulated cluster whose workload shifts chat-heavy -> document-heavy
-> chat-heavy: it moves nodes towards the hot pool, settles, and never moves them back within a
phase (no flapping), with short bursts ignored."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.planner import Decision, DecisionKind, Planner
from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import parse_snapshot
from tests.scheduler.planner_helpers import decode_cap, prefill_cap, stats_body

MAX_RUNNING = 10
BATCH_TOKENS = 2048
SETTLE_S = 10.0   # a started node registers, a drained one leaves, a switched one re-registers, after this
CHAT = (0.3, 2.4)          # (prefill demand in batches, decode demand in nodes' worth of streams)
DOCUMENTS = (5.0, 0.5)


@dataclass
class SimNode:
    node_id: str
    role: str
    busy_until: float = 0.0       # draining (switching or leaving) until then
    next_role: str | None = None  # after a switch; None with busy_until: it leaves


class SimCluster:
    """Nodes whose reports spread the offered load evenly over the active nodes of each pool."""

    def __init__(self, num_prefill: int, num_decode: int) -> None:
        self.nodes = [SimNode(f"prefill-{i}", "prefill") for i in range(num_prefill)]
        self.nodes += [SimNode(f"decode-{i}", "decode") for i in range(num_decode)]
        self.starting: list[tuple[float, SimNode]] = []
        self.next_id = len(self.nodes)

    def apply(self, decision: Decision, now: float) -> None:
        if decision.kind is DecisionKind.SCALE_UP:
            self.starting.append((now + SETTLE_S, SimNode(f"{decision.role}-{self.next_id}", decision.role)))
            self.next_id += 1
            return
        node = next(n for n in self.nodes if n.node_id == decision.node_id)
        node.busy_until = now + SETTLE_S
        node.next_role = decision.role if decision.kind is DecisionKind.SWITCH_ROLE else None

    def advance(self, now: float) -> None:
        self.nodes += [node for at, node in self.starting if at <= now]
        self.starting = [(at, node) for at, node in self.starting if at > now]
        for node in [n for n in self.nodes if n.busy_until and n.busy_until <= now]:
            if node.next_role is None:
                self.nodes.remove(node)
            else:
                node.role, node.busy_until, node.next_role = node.next_role, 0.0, None

    def active(self, role: str) -> list[SimNode]:
        return [n for n in self.nodes if n.role == role and not n.busy_until]

    def body(self, prefill_demand: float, decode_demand: float) -> dict:
        prefill, decode = self.active("prefill"), self.active("decode")
        per_prefill = prefill_demand * BATCH_TOKENS / max(len(prefill), 1)
        per_decode = min(decode_demand / max(len(decode), 1), 1.0) * MAX_RUNNING
        waiting = max(0.0, decode_demand - len(decode)) * MAX_RUNNING
        nodes = {n.node_id: (n.role, self._capacity(n, per_prefill, per_decode)) for n in self.nodes}
        return stats_body(nodes, queued_decode=int(waiting))

    @staticmethod
    def _capacity(node: SimNode, per_prefill: float, per_decode: float) -> dict:
        extra = {"switchable": 1, "draining": 1 if node.busy_until else 0}
        if node.role == "prefill":
            return prefill_cap(0 if node.busy_until else per_prefill, BATCH_TOKENS, **extra)
        return decode_cap(0 if node.busy_until else per_decode, MAX_RUNNING, **extra)


def run_phases(planner: Planner, cluster: SimCluster, phases: list[tuple[float, float]], phase_s: float = 900,
               burst_every: int = 0) -> list[list[Decision]]:
    """Each phase's decisions; with `burst_every` n, every nth snapshot is a one-off prompt burst."""
    now, step, by_phase = 1000.0, 0, []
    for prefill_demand, decode_demand in phases:
        decisions: list[Decision] = []
        for _ in range(int(phase_s / planner.config.interval_s)):
            cluster.advance(now)
            burst = burst_every and step % burst_every == 0
            body = cluster.body(prefill_demand + (8.0 if burst else 0.0), decode_demand)
            for decision in planner.decide(parse_snapshot(body), now):
                cluster.apply(decision, now)
                decisions.append(decision)
            now += planner.config.interval_s
            step += 1
        by_phase.append(decisions)
    return by_phase


def sizes(cluster: SimCluster) -> tuple[int, int]:
    return len(cluster.active("prefill")), len(cluster.active("decode"))


def test_a_full_cluster_switches_nodes_towards_the_hot_pool_and_does_not_flap():
    config = PlannerConfig(min_prefill=1, max_prefill=3, min_decode=1, max_decode=3, max_nodes=4,
                           interval_s=5, sustain_s=30, cooldown_s=60)
    planner, cluster = Planner(config), SimCluster(num_prefill=2, num_decode=2)
    chat, documents, chat_again = run_phases(planner, cluster, [CHAT, DOCUMENTS, CHAT], burst_every=7)
    assert [(d.kind, d.role) for d in chat] == [(DecisionKind.SWITCH_ROLE, "decode")]
    assert [(d.kind, d.role) for d in documents] == [(DecisionKind.SWITCH_ROLE, "prefill")] * 2
    assert [(d.kind, d.role) for d in chat_again] == [(DecisionKind.SWITCH_ROLE, "decode")] * 2
    assert sizes(cluster) == (1, 3)
    assert planner.metrics["held.no_room.prefill"] == 0   # bursts never made prefill hot


def test_with_room_it_grows_the_hot_pool_and_drains_the_cold_one():
    config = PlannerConfig(min_prefill=1, max_prefill=3, min_decode=1, max_decode=3, max_nodes=6,
                           interval_s=5, sustain_s=30, cooldown_s=60)
    planner, cluster = Planner(config), SimCluster(num_prefill=2, num_decode=2)
    chat, documents, chat_again = run_phases(planner, cluster, [CHAT, DOCUMENTS, CHAT])
    assert sorted((d.kind, d.role) for d in chat) == [(DecisionKind.SCALE_DOWN, "prefill"),
                                                      (DecisionKind.SCALE_UP, "decode")]
    assert {(d.kind, d.role) for d in documents} <= {(DecisionKind.SCALE_UP, "prefill"),
                                                     (DecisionKind.SCALE_DOWN, "decode")}
    assert {(d.kind, d.role) for d in chat_again} <= {(DecisionKind.SCALE_UP, "decode"),
                                                      (DecisionKind.SCALE_DOWN, "prefill")}
    assert sizes(cluster) == (1, 3)
    assert all(d.kind is not DecisionKind.SWITCH_ROLE for d in chat + documents + chat_again)
