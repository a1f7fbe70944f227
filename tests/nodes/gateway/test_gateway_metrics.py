"""The gateway's metrics hold what a node sends to a fixed shape: error codes a node invents share one
`other` label (bounded series), and counters or timings of the wrong type or range in a node's
FINAL are ignored and counted, never an exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.cluster import RequestTrace
from nodes.gateway.gateway_metrics import GatewayMetrics

USAGE = {"prompt_tokens": 1, "completion_tokens": 1}


def series(metrics: GatewayMetrics, name: str) -> dict[str, float]:
    body, _ = metrics.render()
    rows = [line.rsplit(" ", 1) for line in body.decode().splitlines() if line.startswith(name)]
    return {key: float(value) for key, value in rows}


def observe(metrics: GatewayMetrics, trace: RequestTrace) -> None:
    metrics.observe_stream(trace, USAGE, [0.5], 0.0, 1.0)


def test_invented_error_codes_share_one_label_known_ones_keep_theirs():
    metrics = GatewayMetrics()
    for i in range(300):
        trace = RequestTrace("r", "s")
        trace.failures += [f"hostile-{i}@a-fake-decode", "node_lost@d", "prefill_kv_failed@p", "bad_reply@d",
                           f"prefill_hostile-{i}@p", "retries_exhausted@"]
        observe(metrics, trace)
    found = series(metrics, "pdbus_cluster_failures_total{")
    assert found == {'pdbus_cluster_failures_total{code="other"}': 600.0,
                     'pdbus_cluster_failures_total{code="node_lost"}': 300.0,
                     'pdbus_cluster_failures_total{code="prefill_kv_failed"}': 300.0,
                     'pdbus_cluster_failures_total{code="bad_reply"}': 300.0,
                     'pdbus_cluster_failures_total{code="retries_exhausted"}': 300.0}


@pytest.mark.parametrize("final", [
    {"stats": {"kv_raw_bytes": "a", "kv_wire_bytes": "b"}}, {"stats": [1]}, {"stats": "x"}, [1, 2], 1.5,
    {"stats": {"kv_raw_bytes": -5, "kv_wire_bytes": 1}}, {"stats": {"kv_raw_bytes": float("nan"), "kv_wire_bytes": 1}},
    {"stats": {"kv_raw_bytes": True, "kv_wire_bytes": 10**30}}])
def test_a_decode_final_of_the_wrong_types_is_ignored_and_counted(final):
    metrics = GatewayMetrics()
    trace = RequestTrace("r", "s")
    trace.decode_final = final
    observe(metrics, trace)
    assert series(metrics, "pdbus_kv_bytes_total") == {}
    assert series(metrics, "pdbus_ignored_node_values_total")["pdbus_ignored_node_values_total"] >= 1


@pytest.mark.parametrize("transfer", [{"seconds": "1", "checksum_failures": "x", "resends": -2}, [1], "x",
                                      {"seconds": float("inf"), "checksum_failures": 2.5, "resends": None}])
def test_a_transfer_report_of_the_wrong_types_is_ignored_and_counted(transfer):
    metrics = GatewayMetrics()
    trace = RequestTrace("r", "s")
    trace.kv_transfers.append(transfer)
    trace.timings.update({"prefill_s": "slow", "decode_s": -1.0, "queue_s": float("nan")})
    observe(metrics, trace)
    assert series(metrics, "pdbus_ignored_node_values_total")["pdbus_ignored_node_values_total"] >= 4
    assert series(metrics, "pdbus_kv_resends_total") == {"pdbus_kv_resends_total": 0.0}


def test_good_values_are_still_counted():
    metrics = GatewayMetrics()
    trace = RequestTrace("r", "s")
    trace.decode_final = {"stats": {"kv_raw_bytes": 400, "kv_wire_bytes": 100}}
    trace.kv_transfers.append({"seconds": 0.5, "checksum_failures": 2, "resends": 3})
    trace.timings["prefill_s"] = 0.25
    trace.num_bad_replies = 2
    observe(metrics, trace)
    assert series(metrics, "pdbus_kv_bytes_total{") == {'pdbus_kv_bytes_total{kind="raw"}': 400.0,
                                                        'pdbus_kv_bytes_total{kind="wire"}': 100.0}
    assert series(metrics, "pdbus_kv_resends_total") == {"pdbus_kv_resends_total": 3.0}
    assert series(metrics, 'pdbus_stage_seconds_count{stage="prefill"}') == {
        'pdbus_stage_seconds_count{stage="prefill"}': 1.0}
    assert series(metrics, "pdbus_ignored_node_values_total") == {"pdbus_ignored_node_values_total": 0.0}
    assert series(metrics, "pdbus_bad_replies_total") == {"pdbus_bad_replies_total": 2.0}


def test_prefill_prefix_hits_come_from_the_nodes_reports_and_departed_nodes_drop_out():
    metrics = GatewayMetrics()
    capacities = {"p1": {"prompt_tokens": 1000, "prefix_cached_tokens": 600},
                  "p2": {"prompt_tokens": 1000, "prefix_cached_tokens": 200},
                  "d1": {"kv_blocks_free": 5},                                   # a decode node: not listed
                  "p3": {"prompt_tokens": float("nan"), "prefix_cached_tokens": 1}}   # junk: ignored
    metrics.set_broker_stats({"nodes_by_role": {"prefill": 3}, "capacity_by_node": capacities})
    rows = series(metrics, "pdbus_prefill_prompt_tokens")
    assert rows == {'pdbus_prefill_prompt_tokens{kind="prompt",node="p1"}': 1000.0,
                    'pdbus_prefill_prompt_tokens{kind="cached",node="p1"}': 600.0,
                    'pdbus_prefill_prompt_tokens{kind="prompt",node="p2"}': 1000.0,
                    'pdbus_prefill_prompt_tokens{kind="cached",node="p2"}': 200.0}
    assert series(metrics, "pdbus_prefix_cache_hit_ratio") == {"pdbus_prefix_cache_hit_ratio": 0.4}
    metrics.set_broker_stats({"capacity_by_node": {"p2": capacities["p2"]}})   # p1 left
    assert set(series(metrics, "pdbus_prefill_prompt_tokens")) == {
        'pdbus_prefill_prompt_tokens{kind="prompt",node="p2"}', 'pdbus_prefill_prompt_tokens{kind="cached",node="p2"}'}
    assert series(metrics, "pdbus_prefix_cache_hit_ratio") == {"pdbus_prefix_cache_hit_ratio": 0.2}
    metrics.set_broker_stats({"capacity_by_node": "not a map"})   # a broken answer changes nothing
    assert series(metrics, "pdbus_prefix_cache_hit_ratio") == {"pdbus_prefix_cache_hit_ratio": 0.2}


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["nodes_by_role", "queued_by_service", "capacity_by_node"]) | st.text(max_size=8),
                       json_values, max_size=6))
def test_any_broker_stats_answer_leaves_the_gauges_finite_and_never_raises(stats):
    """The broker's stats answer is peer input: whatever its shape, a scrape goes on."""
    metrics = GatewayMetrics()
    metrics.set_broker_stats(stats)
    metrics.set_broker_stats({"capacity_by_node": stats})
    ratio = series(metrics, "pdbus_prefix_cache_hit_ratio")["pdbus_prefix_cache_hit_ratio"]
    assert 0.0 <= ratio < float("inf")


def test_kv_a_decode_node_held_counts_as_tokens_and_bytes_not_moved():
    metrics = GatewayMetrics()
    trace = RequestTrace("r", "s")
    trace.num_kv_held_tokens = 96   # 96 of 100 prompt tokens held: the 4 sent took 400 raw bytes
    trace.decode_final = {"stats": {"kv_raw_bytes": 400, "kv_wire_bytes": 100}, "usage": {"prompt_tokens": 100}}
    observe(metrics, trace)
    assert series(metrics, 'pdbus_kv_bytes_total{kind="held"}') == {'pdbus_kv_bytes_total{kind="held"}': 9600.0}
    assert series(metrics, 'pdbus_tokens_total{kind="prompt_kv_held"}') == {
        'pdbus_tokens_total{kind="prompt_kv_held"}': 96.0}
    for usage in ({"prompt_tokens": 96}, {"prompt_tokens": "x"}, "junk"):   # nothing sent, or junk: no bytes
        trace.decode_final = {"stats": {"kv_raw_bytes": 400, "kv_wire_bytes": 100}, "usage": usage}
        observe(metrics, trace)
    assert series(metrics, 'pdbus_kv_bytes_total{kind="held"}') == {'pdbus_kv_bytes_total{kind="held"}': 9600.0}


def test_decode_prefix_hits_come_from_the_decode_nodes_reports():
    metrics = GatewayMetrics()
    capacities = {"d1": {"kv_imported_tokens": 300, "prefix_reused_tokens": 700},
                  "d2": {"kv_imported_tokens": 100, "prefix_reused_tokens": "x"},   # junk: ignored
                  "p1": {"prompt_tokens": 10, "prefix_cached_tokens": 0}}
    metrics.set_broker_stats({"capacity_by_node": capacities})
    assert series(metrics, "pdbus_decode_kv_tokens") == {'pdbus_decode_kv_tokens{kind="imported",node="d1"}': 300.0,
                                                         'pdbus_decode_kv_tokens{kind="held",node="d1"}': 700.0}
    assert series(metrics, "pdbus_decode_prefix_hit_ratio") == {"pdbus_decode_prefix_hit_ratio": 0.7}
    metrics.set_broker_stats({"capacity_by_node": {}})
    assert series(metrics, "pdbus_decode_kv_tokens") == {}
