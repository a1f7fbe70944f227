"""A cluster's log read into the elasticity benchmark's timeline: the planner's decisions with
their times, and the node roles over the run."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from harness.bench.serve.cluster_events import epoch_of, read_events, timeline, wanted
from harness.bench.serve.systems import PdbusSystem, planner_env

START = datetime(2026, 12, 6, 10, 0, 0, tzinfo=UTC).timestamp()


def at(seconds: float, event: str, **fields) -> dict:
    stamp = datetime.fromtimestamp(START + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"event": event, "timestamp": stamp, **fields}


EVENTS = [
    at(-20, "cluster_node_ready", node_id="prefill-0", role="prefill"),
    at(-19, "cluster_node_ready", node_id="decode-0", role="decode"),
    at(12, "planner_decision", kind="switch_role", role="decode", node_id="prefill-0", reason="decode hot for 5s"),
    at(13.5, "role_switched", child="prefill-0", role="decode", num_switches=1),
    at(70, "planner_wanted", kind="scale_up", role="prefill", reason="prefill hot"),
    at(71, "planner_decision", kind="switch_role", role="prefill", node_id="prefill-0", reason="TTFT p90 3.1s > 2.0s"),
    at(74, "role_switched", child="prefill-0", node_id="prefill-0", role="prefill", num_switches=2),
    at(150, "planner_held", kind="switch_role", role="decode", node_id="prefill-0", reason="held: layout"),
    at(200, "planner_decision", kind="scale_down", role="decode", node_id="decode-0", reason="after the load"),
]


def test_timestamps_are_read_as_epoch_seconds():
    assert epoch_of(at(1.5, "x")) == pytest.approx(START + 1.5)
    assert epoch_of({"timestamp": "yesterday"}) is None and epoch_of({}) is None


def test_decisions_are_timed_from_the_load_start():
    found = timeline(EVENTS, START, load_end=START + 180)
    assert [(d["t_s"], d["kind"], d["node_id"]) for d in found["planner_decisions"]] == [
        (12.0, "switch_role", "prefill-0"), (70.0, "wanted", None), (71.0, "switch_role", "prefill-0"),
        (150.0, "held", "prefill-0")]
    assert found["planner_decisions"][2]["reason"] == "TTFT p90 3.1s > 2.0s"


def test_the_role_timeline_starts_from_the_roles_before_the_load():
    steps = timeline(EVENTS, START, load_end=START + 180)["role_timeline"]
    assert [(s["t_s"], s["prefill"], s["decode"], s["switching"]) for s in steps] == [
        (0.0, 1, 1, 0), (12.0, 0, 1, 1), (13.5, 0, 2, 0), (71.0, 0, 1, 1), (74.0, 1, 1, 0)]


def test_a_static_cluster_is_one_step_and_a_drained_node_leaves_the_count():
    events = [at(-5, "cluster_node_ready", node_id="both-0", role="both"),
              at(-5, "cluster_node_ready", node_id="both-1", role="both"),
              at(30, "planner_decision", kind="scale_down", role="decode", node_id="both-1", reason=""),
              at(33, "cluster_node_drained", child="both-1")]
    assert timeline(events[:2], START)["role_timeline"] == [
        {"t_s": 0.0, "prefill": 0, "decode": 0, "both": 2, "switching": 0, "draining": 0}]
    steps = timeline(events, START)["role_timeline"]
    assert [(s["both"], s["draining"]) for s in steps] == [(2, 0), (1, 1), (1, 0)]


def test_unreadable_events_are_skipped():
    assert timeline([{"event": "planner_decision", "kind": "switch_role"}], START) == {
        "planner_decisions": [], "role_timeline": [
            {"t_s": 0.0, "prefill": 0, "decode": 0, "both": 0, "switching": 0, "draining": 0}]}


def test_events_are_read_from_a_log_file(tmp_path):
    log = tmp_path / "cluster.log"
    log.write_text("\n".join([json.dumps(EVENTS[0]), "not json", json.dumps(at(1, "node_heartbeat")),
                              json.dumps(EVENTS[2]), "[1, 2]"]) + "\n")
    assert read_events(log) == [EVENTS[0], EVENTS[2]]
    assert not wanted([1]) and wanted(EVENTS[3])


def test_the_elastic_cluster_runs_the_planner_with_switchable_nodes(tmp_path):
    planner = {"min_prefill": 0, "interval_s": 1.0, "slo_window_s": 10.0, "gateway_metrics_url": "", "x": True}
    system = PdbusSystem("pdbus-elastic", colocated=False, model="tiny", planner=planner, log_path=tmp_path / "l")
    assert "--planner" in system.argv() and "--prefill" in system.argv()
    assert system.env["PDBUS__NODE__SWITCHABLE"] == "true"
    assert planner_env(planner) == {"PDBUS__NODE__SWITCHABLE": "true", "PDBUS__PLANNER__MIN_PREFILL": "0",
                                    "PDBUS__PLANNER__INTERVAL_S": "1.0", "PDBUS__PLANNER__SLO_WINDOW_S": "10.0",
                                    "PDBUS__PLANNER__GATEWAY_METRICS_URL": '""', "PDBUS__PLANNER__X": "true"}
    assert "--planner" not in PdbusSystem("pdbus-disagg", colocated=False).argv()
    system.events = EVENTS
    assert system.timeline(START, START + 180)["role_timeline"][-1]["prefill"] == 1
