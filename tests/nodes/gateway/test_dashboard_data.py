"""The dashboard's window on a fake clock: per-second series and percentiles over the window, old
seconds dropped, bounded samples and events, failovers and KV transfers as events, and the node
table's liveness from the broker's stats (joined, lost, forgotten; hostile values ignored)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.cluster import RequestTrace
from nodes.gateway.dashboard_data import SAMPLES_PER_SECOND, DashboardWindow, quantiles
from nodes.gateway.dashboard_nodes import NodeTable

WALL = 1_700_000_000.0


def stats(*nodes: tuple[str, str, dict], queued: int = 0) -> dict:
    return {"nodes_by_role": {"gateway": 1, **{role: 1 for _, role, _ in nodes}},
            "queued_by_service": {"decode": queued, "prefill": 0}, "num_routes": 2,
            "role_by_node": {node_id: role for node_id, role, _ in nodes},
            "capacity_by_node": {node_id: capacity for node_id, _, capacity in nodes}}


DECODE = ("decode-0", "decode", {"kv_blocks_total": 100, "kv_blocks_free": 75, "num_running": 3,
                                 "max_running": 16, "full": 0, "kv_imported_tokens": 10})
PREFILL = ("prefill-0", "prefill", {"queued_tokens": 40, "prompt_tokens": 200, "prefix_cached_tokens": 50,
                                    "px.abc": 32})


def total(values: list) -> float:
    return sum(value for value in values if value is not None)


def request(window: DashboardWindow, started: float, num_tokens: int = 5, gap: float = 0.02,
            ttft: float = 0.1, trace: RequestTrace | None = None) -> float:
    times = [started + ttft + i * gap for i in range(num_tokens)]
    window.observe_stream(trace or RequestTrace("r", "s"), {}, times, started, times[-1])
    window.observe_request("completions", "ok", times[-1])
    return times[-1]


def test_a_request_shows_in_the_series_and_the_summary(clock):
    window = DashboardWindow(window_s=60)
    ended = request(window, clock.now, num_tokens=11, gap=0.01, ttft=0.25)
    snap = window.snapshot(clock.advance(1), WALL)
    assert snap["summary"]["ttft"] == {"p50": 0.25, "p90": 0.25, "p99": 0.25, "count": 1}
    assert abs(snap["summary"]["tpot"]["p50"] - 0.01) < 1e-9 and snap["summary"]["itl"]["count"] == 10
    series = snap["series"]
    assert len(series["time"]) == 60 and series["time"][-1] == round(int(clock.now) + WALL - clock.now, 3)
    assert total(series["tokens_per_s"]) == 11 and total(series["requests_per_s"]) == 1
    assert series["tokens_per_s"][-1] is None   # the current second is not over
    index = series["time"].index(round(int(ended) + WALL - clock.now, 3))
    assert series["ttft_p50"][index] == 0.25 and series["ttft_p99"][index - 1] is None
    assert snap["summary"]["requests"] == {"ok": 1}
    json.dumps(snap, allow_nan=False)   # the page reads it as JSON as is


def test_tokens_count_in_the_second_they_arrived_latencies_in_the_second_the_request_ended(clock):
    window = DashboardWindow(window_s=30)
    started = float(int(clock.now))
    request(window, started, num_tokens=30, gap=0.1, ttft=0.05)   # 3 s of tokens, ends in second 2
    snap = window.snapshot(started + 4.5, WALL)
    tokens = snap["series"]["tokens_per_s"][-5:]
    assert tokens == [10, 10, 10, 0, None]
    assert [p is not None for p in snap["series"]["ttft_p50"][-5:]] == [False, False, True, True, True]


def test_old_seconds_leave_the_window(clock):
    window = DashboardWindow(window_s=10)
    request(window, clock.now)
    window.observe_stream(RequestTrace("r", "s", failures=["node_lost@decode-1"], num_failovers=1), {},
                          [clock.now + 0.5], clock.now, clock.now + 0.5)
    assert window.snapshot(clock.advance(5), WALL)["summary"]["num_failovers"] == 1
    snap = window.snapshot(clock.advance(10), WALL)
    assert snap["summary"]["ttft"]["count"] == 0 and total(snap["series"]["tokens_per_s"]) == 0
    assert snap["summary"]["num_failovers"] == 0 and snap["summary"]["requests"] == {}
    assert len(window.seconds) == 0
    assert snap["incidents"][0]["kind"] == "failover"   # events outlive the window: the page's history


def test_percentiles_over_the_whole_window(clock):
    window = DashboardWindow(window_s=120)
    for i in range(100):
        request(window, clock.now + i, ttft=(i + 1) / 100)
    snap = window.snapshot(clock.advance(101), WALL)
    assert snap["summary"]["ttft"] == {"p50": 0.51, "p90": 0.91, "p99": 1.0, "count": 100}
    assert quantiles([]) == {"p50": None, "p90": None, "p99": None}


def test_samples_per_second_are_bounded_but_counted(clock):
    window = DashboardWindow(window_s=10)
    times = [clock.now + i * 1e-5 for i in range(5000)]
    window.observe_stream(RequestTrace("r", "s"), {}, times, clock.now, times[-1])
    bucket = window.seconds[int(times[-1])]
    assert len(bucket.latency["itl"].values) == SAMPLES_PER_SECOND and bucket.latency["itl"].num_seen == 4999
    assert window.snapshot(clock.advance(1), WALL)["summary"]["itl"]["count"] == 4999


def test_failovers_and_transfers_are_bounded_events_newest_first(clock):
    window = DashboardWindow(window_s=60, max_events=5)
    for i in range(8):
        trace = RequestTrace(f"cmpl-{i}", "s", decode_node_ids=["decode-0", "decode-1"], prefill_node_ids=["prefill-0"],
                             failures=["node_lost@decode-0"], num_failovers=1)
        trace.kv_transfers.append({"raw_bytes": 4096, "wire_bytes": 1024, "seconds": 0.003, "mode": "int8",
                                   "compression": "none"})
        request(window, clock.advance(0.3), trace=trace)
    snap = window.snapshot(clock.advance(1), WALL)
    assert len(snap["incidents"]) == 5 and len(snap["transfers"]) == 5
    newest = snap["incidents"][0]
    assert newest["kind"] == "failover" and newest["node"] == "decode-0" and newest["request_id"] == "cmpl-7"
    assert newest["decode_nodes"] == ["decode-0", "decode-1"] and "at" not in newest
    transfer = snap["transfers"][0]
    assert transfer["prefill_node"] == "prefill-0" and transfer["decode_node"] == "decode-1"
    assert transfer["raw_bytes"] == 4096 and transfer["wire_bytes"] == 1024 and transfer["mode"] == "int8"
    assert snap["summary"]["kv_wire_bytes"] == 8 * 1024 and snap["summary"]["num_transfers"] == 8
    assert snap["summary"]["num_failovers"] == 8


def test_a_prefill_retry_is_not_a_failover(clock):
    window = DashboardWindow()
    request(window, clock.now, trace=RequestTrace("r", "s", failures=["prefill_node_lost@prefill-1"],
                                                  num_prefill_retries=1))
    assert window.snapshot(clock.advance(1), WALL)["incidents"][0]["kind"] == "prefill_retry"


def test_nodes_from_the_broker_with_kv_use_streams_and_liveness(clock):
    window = DashboardWindow(window_s=60)
    window.observe_broker(stats(DECODE, PREFILL, queued=2), clock.now)
    snap = window.snapshot(clock.advance(0.5), WALL)
    decode, prefill = snap["nodes"]   # sorted by role, then id
    assert decode["id"] == "decode-0" and decode["state"] == "live" and decode["kv_used"] == 0.25
    assert decode["num_running"] == 3 and "kv_imported_tokens" not in decode
    assert prefill["queued_tokens"] == 40 and prefill["prefix_hit"] == 0.25 and "px.abc" not in prefill
    assert snap["broker"]["queued_by_service"] == {"decode": 2, "prefill": 0} and snap["incidents"] == []
    assert snap["series"]["queued"][-1] == 2 and snap["series"]["running"][-1] == 3
    assert snap["series"]["kv_used"][-1] == 0.25 and snap["series"]["queued"][-2] is None

    window.observe_broker(stats(PREFILL), clock.advance(1))   # decode-0 died
    window.observe_broker(stats(PREFILL, ("decode-1", "decode", {"full": 1})), clock.advance(1))
    snap = window.snapshot(clock.now, WALL)
    states = {node["id"]: node["state"] for node in snap["nodes"]}
    assert states == {"decode-0": "lost", "decode-1": "full", "prefill-0": "live"}
    assert [(e["kind"], e["node"]) for e in snap["incidents"]] == [("node_joined", "decode-1"),
                                                                 ("node_lost", "decode-0")]
    window.observe_broker(None, clock.advance(1))   # the broker did not answer
    snap = window.snapshot(clock.now, WALL)
    assert not snap["broker"]["ok"] and {n["state"] for n in snap["nodes"]} == {"lost", "unknown"}


def test_a_lost_node_is_forgotten_and_a_returning_one_rejoins(clock):
    table = NodeTable(forget_after_s=30)
    table.update(stats(DECODE), clock.now)
    assert [e.kind for e in table.update(stats(), clock.advance(1))] == ["node_lost"]
    assert [e.kind for e in table.update(stats(DECODE), clock.advance(1))] == ["node_joined"]
    table.update(stats(), clock.advance(1))
    table.update(stats(), clock.advance(31))
    assert table.rows(clock.now) == [] and table.totals().kv_used is None


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["nodes_by_role", "queued_by_service", "role_by_node", "capacity_by_node",
                                        "num_routes"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                                    lambda inner: st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)))
def test_any_stats_answer_gives_a_json_snapshot(answer):
    window = DashboardWindow(window_s=5)
    window.observe_broker(answer, 10.0)
    window.observe_broker(answer, 11.0)
    json.dumps(window.snapshot(11.5, WALL), allow_nan=False)


def test_a_young_window_charts_from_its_first_second_and_at_least_a_minute(clock):
    window = DashboardWindow(window_s=300)
    request(window, clock.now)
    assert len(window.snapshot(clock.advance(1), WALL)["series"]["time"]) == 60
    assert len(window.snapshot(clock.advance(119), WALL)["series"]["time"]) == 121
    assert len(window.snapshot(clock.advance(1000), WALL)["series"]["time"]) == 300
