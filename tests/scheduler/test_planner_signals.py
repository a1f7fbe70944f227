"""The planner's inputs: the stats body parsed into a Snapshot (peer data: never raises), the pools'
pressures, and `[planner]` settings."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.config_file import load_settings, section
from scheduler.planner import Planner
from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import parse_signals, parse_snapshot, pool_load
from tests.scheduler.planner_helpers import decode_cap, pools, prefill_cap, stats_body

# -- parsing ---------------------------------------------------------------------------------


def test_a_well_formed_body_gives_every_node_with_its_role():
    body = pools([prefill_cap(100)], [decode_cap(2), decode_cap(3, draining=1, switchable=1)], queued_decode=4)
    snapshot = parse_snapshot(body)
    assert snapshot.valid and snapshot.num_malformed == 0
    assert [(n.node_id, n.role) for n in snapshot.nodes] == [
        ("decode-0", "decode"), ("decode-1", "decode"), ("prefill-0", "prefill")]
    assert snapshot.node("decode-1").draining and snapshot.node("decode-1").switchable
    assert not snapshot.node("decode-0").draining
    assert snapshot.queued_by_service["decode"] == 4


def test_without_role_by_node_the_role_comes_from_the_capacity_keys():
    body = pools([prefill_cap()], [decode_cap()])
    del body["role_by_node"]
    snapshot = parse_snapshot(body)
    assert {n.node_id: n.role for n in snapshot.nodes} == {"prefill-0": "prefill", "decode-0": "decode"}


@pytest.mark.parametrize("bad", [
    {"queued_tokens": "many"}, {"max_running": -1}, {"kv_blocks_free": math.nan}, {"draining": True},
    {"num_running": math.inf}, "not a map",
])
def test_a_malformed_entry_is_skipped_and_counted(bad):
    body = pools([prefill_cap()], [decode_cap()])
    body["capacity_by_node"]["decode-0"] = {**decode_cap(), **bad} if isinstance(bad, dict) else bad
    snapshot = parse_snapshot(body)
    assert snapshot.valid and snapshot.num_malformed == 1
    assert [n.node_id for n in snapshot.nodes] == ["prefill-0"]


def test_unknown_roles_and_bad_ids_are_malformed():
    body = stats_body({"x" * 129: ("decode", decode_cap()), "odd-0": ("decode", decode_cap())})
    body["role_by_node"]["odd-0"] = "wizard"
    assert parse_snapshot(body).num_malformed == 2


@pytest.mark.parametrize("body", [None, [], "stats", {"nodes_by_role": {}}, {"nodes_by_role": {},
                                  "queued_by_service": {}, "capacity_by_node": []}])
def test_a_body_without_its_maps_is_not_valid(body):
    assert not parse_snapshot(body).valid


def test_signals_from_a_loose_map():
    signals = parse_signals({"slo_attainment": 0.9, "ttft_p90_s": "slow", "tpot_p90_s": -1})
    assert (signals.slo_attainment, signals.ttft_p90_s, signals.tpot_p90_s) == (0.9, None, None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
capacity = st.dictionaries(st.sampled_from(["queued_tokens", "max_batch_tokens", "kv_blocks_total",
                                            "kv_blocks_free", "max_running", "num_running", "full",
                                            "draining", "switchable", "px.a"]), json_values, max_size=6)
bodies = st.fixed_dictionaries({}, optional={
    "nodes_by_role": st.dictionaries(st.sampled_from(["prefill", "decode", "both", 3]), json_values),
    "queued_by_service": st.dictionaries(st.sampled_from(["prefill", "decode"]), json_values) | json_values,
    "capacity_by_node": st.dictionaries(st.sampled_from(["prefill-0", "decode-0", "decode-1", ""]),
                                        capacity | json_values),
    "role_by_node": st.dictionaries(st.sampled_from(["prefill-0", "decode-0", "decode-1"]),
                                    st.sampled_from(["prefill", "decode", "both", "x"]) | json_values) | json_values,
})


@settings(max_examples=300, deadline=None)
@given(st.lists(bodies | json_values, min_size=1, max_size=6))
def test_random_bodies_never_raise_in_the_parser_or_the_planner(sequence):
    planner = Planner(PlannerConfig(sustain_s=0, cooldown_s=0, interval_s=1))
    for step, body in enumerate(sequence):
        snapshot = parse_snapshot(body)
        assert snapshot.num_malformed >= 0
        decisions = planner.decide(snapshot, 1000.0 + step)
        assert len(decisions) <= 1
        assert all(d.node_id is None or snapshot.node(d.node_id) for d in decisions)
    assert planner.metrics["snapshots"] == len(sequence)


# -- pressures -------------------------------------------------------------------------------


def test_prefill_pressure_is_batches_queued_per_node_without_draining_nodes():
    snapshot = parse_snapshot(pools([prefill_cap(4096), prefill_cap(0), prefill_cap(9999, draining=1)]))
    load = pool_load(snapshot, "prefill", 2048)
    assert load.size == 2 and load.pressure == pytest.approx(1.0)


def test_prefill_pressure_falls_back_to_a_batch_size_when_none_is_reported():
    snapshot = parse_snapshot(pools([{"queued_tokens": 1000}]))
    assert pool_load(snapshot, "prefill", 500).pressure == pytest.approx(2.0)


def test_decode_pressure_is_the_higher_of_kv_and_stream_use():
    kv_bound = parse_snapshot(pools(decode=[decode_cap(1, free=10), decode_cap(1, free=30)]))
    assert pool_load(kv_bound, "decode", 1).pressure == pytest.approx(0.8)
    stream_bound = parse_snapshot(pools(decode=[decode_cap(9), decode_cap(8)]))
    assert pool_load(stream_bound, "decode", 1).pressure == pytest.approx(0.85)
    assert pool_load(parse_snapshot(pools()), "decode", 1).pressure == 0.0


# -- settings --------------------------------------------------------------------------------


def test_settings_read_the_planner_table(repo_root):
    values = section(load_settings(repo_root / "config" / "local.toml", environ={}), "planner")
    assert PlannerConfig.from_settings(values) == PlannerConfig(**values)
    config = PlannerConfig.from_settings({"max_decode": 6, "max_nodes": 8, "sustain_s": 10})
    assert (config.max_decode, config.max_nodes, config.sustain_s) == (6, 8, 10.0)


@pytest.mark.parametrize("values", [
    {"max_decode": 2.5}, {"max_nodes": True}, {"sustain_s": "soon"}, {"typo_s": 3},
    {"min_decode": 0}, {"min_prefill": 3, "max_prefill": 2}, {"max_nodes": 1},
    {"decode_cold_use": 0.9}, {"interval_s": 0}, {"cooldown_s": -1},
])
def test_bad_settings_are_refused(values):
    with pytest.raises(ValueError, match=r"\[planner\]"):
        PlannerConfig.from_settings(values)
