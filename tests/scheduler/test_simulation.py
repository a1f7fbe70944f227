"""The simulation's fleet-scale figures: exact ring shares against sampled sessions, and the bulk-built
ring placing sessions exactly as a ring built one join at a time."""

from __future__ import annotations

import pytest

from scheduler.policy import ClusterPolicy
from scheduler.ring import HashRing
from scheduler.simulation import (
    SimCluster,
    decision_seconds,
    membership_seconds,
    node_ids,
    ring_figures,
    session_ids,
)


def test_ring_figures_are_what_sampled_sessions_converge_to():
    figures = ring_figures(20)
    ring = HashRing()
    ring.add_nodes(node_ids(20))
    sessions = session_ids(40_000)
    before = {s: ring.lookup(s) for s in sessions}
    ring.add_node("decode-new")
    moved = sum(before[s] != ring.lookup(s) for s in sessions) / len(sessions)
    assert moved == pytest.approx(figures.join_moved, abs=0.005)
    assert sum(home == node_ids(20)[-1] for home in before.values()) / len(sessions) == pytest.approx(
        figures.leave_moved, abs=0.005)
    assert figures.join_ideal == 1 / 21 and figures.leave_ideal == 1 / 20
    assert figures.min_share < 1 < figures.max_share


def test_a_bulk_built_cluster_places_sessions_as_one_built_join_by_join():
    bulk = SimCluster(ClusterPolicy(), node_ids(12))
    joined = SimCluster(ClusterPolicy())
    for node_id in node_ids(12):
        joined.join(node_id)
    for session_id in session_ids(300):
        assert bulk.request("decode", session_id).node_id == joined.request("decode", session_id).node_id


def test_a_placement_a_join_and_a_leave_are_timed():
    assert 0 < decision_seconds(10, num_decisions=20) < 1
    assert all(0 < seconds < 1 for seconds in membership_seconds(10, num_changes=2))
