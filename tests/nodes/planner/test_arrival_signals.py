"""Reading the gateway's `/slo/arrivals` for the planner: its URL, the clock mapping, and what a
peer may send (bad bodies are None, bad rows skipped, nothing raises)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.planner.arrival_signals import MAX_ROWS, ArrivalReader, arrivals_url
from scheduler.planner_signals import ArrivalCount


def body(now: float, rows: list) -> str:
    return json.dumps({"now": now, "window_s": 600, "seconds": rows})


def test_the_url_sits_beside_metrics_and_asks_for_the_targets():
    assert arrivals_url("http://127.0.0.1:8000/metrics", (2.0, 0.08)) == \
        "http://127.0.0.1:8000/slo/arrivals?ttft_s=2&tpot_s=0.08"
    assert arrivals_url("http://gw/metrics", (0.0, 0.0)) is None          # nothing to judge by
    assert arrivals_url("http://gw/stats", (1.0, 0.0)) is None            # not a gateway's /metrics


def test_seconds_map_onto_the_readers_clock_and_keep_their_place_from_answer_to_answer():
    reader = ArrivalReader()
    first = reader.read(body(1000.0, [[990, 3, 1, 2], [995, 0, 2, 0]]), now=5.0)
    assert first == (ArrivalCount(-5.0, 3, 1, 3.0), ArrivalCount(0.0, 0, 2, 0.0))   # no credit: misses earn none
    later = reader.read(body(1010.03, [[990, 4, 1, 0]]), now=15.0)        # 30 ms of fetch jitter
    assert later == (ArrivalCount(-5.0, 4, 1, 4.0),)
    restarted = reader.read(body(50.0, [[49, 1, 0, 0]]), now=20.0)        # another clock: a new offset
    assert restarted == (ArrivalCount(19.0, 1, 0, 1.0),)


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"seconds": []}', '{"now": "1", "seconds": []}',
                                  '{"now": true, "seconds": []}', '{"now": 1e999, "seconds": []}',
                                  '{"now": 1, "seconds": {}}', "[" * 100_000])
def test_a_body_of_another_shape_is_none(text):
    assert ArrivalReader().read(text, now=0.0) is None


def test_rows_of_another_shape_are_skipped_and_rows_are_bounded():
    rows = [[1, 1, 0, 0], [2, -1, 0, 0], [3, True, 0, 0], [4, 1.5, 0, 0], [5, 1, 0], "x", [6, 2**40, 0, 0],
            [7.0, 1, 0, 0], [8, 0, 1, 0], [9, 1, 2, 0, 1.5], [10, 1, 2, 0, 0.5], [11, 1, 2, 0, 3.5],
            [12, 1, 2, 0, "x"], [13, 1, 2, 0, float("nan")], [14, 1, 2, 0, True], [15, 1, 2, 0, 3.0000001],
            [16, 1, 1, 0, 1, 9]]
    assert ArrivalReader().read(body(0.0, rows), now=0.0) == (
        ArrivalCount(1.0, 1, 0, 1.0), ArrivalCount(8.0, 0, 1, 0.0), ArrivalCount(9.0, 1, 2, 1.5),
        ArrivalCount(15.0, 1, 2, 3.0))   # the gateway's rounding, clamped
    many = ArrivalReader().read(body(0.0, [[i, 1, 0, 0] for i in range(MAX_ROWS + 5)]), now=0.0)
    assert many is not None and len(many) == MAX_ROWS


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
                    max_leaves=30))
def test_nothing_a_peer_sends_makes_it_raise(value):
    text = json.dumps(value) if not isinstance(value, dict) else json.dumps({"now": 1.0, "seconds": [value], **value})
    result = ArrivalReader().read(text, now=0.0)
    assert result is None or all(isinstance(c, ArrivalCount) for c in result)
