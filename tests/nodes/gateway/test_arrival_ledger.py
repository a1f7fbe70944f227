"""`ArrivalLedger`: SLO outcomes grouped by second of arrival, on a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.gateway.arrival_ledger import ArrivalLedger, SecondCounts

TTFT, TPOT = 2.0, 0.1


def counts(ledger: ArrivalLedger, now: float) -> list[tuple[int, int, int, int]]:
    return [(c.second, c.within, c.missed, c.pending) for c in ledger.outcomes(now, TTFT, TPOT)]


def test_each_request_is_counted_in_the_second_it_arrived_by_what_is_known_of_it():
    ledger = ArrivalLedger()
    fast = ledger.arrived(10.2)
    fast.token(10.5)
    fast.token(10.55)
    fast.end(12.0, counted=True, served=True)
    slow_tokens = ledger.arrived(10.7)
    slow_tokens.token(11.0)
    slow_tokens.token(11.3)                                                   # TPOT over its target
    slow_tokens.end(20.0, counted=True, served=True)
    ledger.arrived(11.1)                                                      # waiting: no first token yet
    streaming = ledger.arrived(11.5)
    streaming.token(12.0)                                               # within TTFT, TPOT unknown
    assert counts(ledger, now=12.5) == [(10, 1, 1, 0), (11, 0, 0, 2)]
    assert counts(ledger, now=13.2) == [(10, 1, 1, 0), (11, 0, 1, 1)]         # waited past 2 s: missed already


def test_a_stream_is_judged_by_its_pace_so_far_until_it_ends():
    ledger = ArrivalLedger()
    slow, steady = ledger.arrived(0.0), ledger.arrived(0.5)
    for i in range(4):
        slow.token(1.0 + 0.3 * i)        # 300 ms a token: over the 100 ms target already
        steady.token(1.0 + 0.05 * i)
    assert counts(ledger, now=2.5) == [(0, 0, 1, 1)]
    for i in range(12):
        slow.token(1.91 + 0.001 * i)   # it sped up: 0.92 s over 15 gaps, 61 ms a token
    slow.end(3.0, counted=True, served=True)   # the latest word
    assert counts(ledger, now=3.0) == [(0, 1, 0, 1)]


def test_a_failure_of_the_clusters_misses_and_a_clients_leaves_the_counts():
    ledger = ArrivalLedger()
    failed, cancelled, empty = ledger.arrived(1.0), ledger.arrived(1.1), ledger.arrived(1.2)
    failed.token(1.5)
    failed.end(2.0, counted=True, served=False)
    cancelled.end(1.5, counted=False, served=False)
    empty.end(1.8, counted=True, served=True)      # no token (echo only): judged by its duration
    assert counts(ledger, now=3.0) == [(1, 1, 1, 0)]
    late_empty = ledger.arrived(4.0)
    late_empty.end(7.0, counted=True, served=True)
    assert counts(ledger, now=8.0)[-1] == (4, 0, 1, 0)


def test_a_request_ends_once_and_its_first_token_is_the_first_of_its_tokens():
    ledger = ArrivalLedger()
    arrival = ledger.arrived(0.0)
    for i in range(21):
        arrival.token(0.5 + 0.1 * i)   # TTFT 0.5 s from the first; were it the last's, 2.5 s would miss
    arrival.end(3.0, counted=True, served=True)
    arrival.end(9.0, counted=False, served=False)
    assert counts(ledger, now=10.0) == [(0, 1, 0, 0)]


def test_targets_of_zero_are_not_checked():
    ledger = ArrivalLedger()
    arrival = ledger.arrived(0.0)
    arrival.token(50.0)
    arrival.token(59.0)
    arrival.end(60.0, counted=True, served=True)
    assert ledger.outcomes(61.0, 0.0, 0.0) == [SecondCounts(0, 1, 0, 0, 1.0)]


def test_a_miss_earns_the_share_of_the_targets_it_met():
    ledger = ArrivalLedger()
    late, slow, both, failed, waiting = (ledger.arrived(float(i)) for i in range(5))
    for arrival, first, tpot in ((late, 4.0, 0.05), (slow, 2.0, 0.2), (both, 6.0, 0.2), (failed, 3.5, 0.05)):
        arrival.token(first)
        arrival.token(first + tpot)
        arrival.end(first + 1.0, counted=True, served=arrival is not failed)
    credits = [c.credit for c in ledger.outcomes(12.0, TTFT, TPOT)]
    # TTFT 4 s of 2: half; TPOT 0.2 s of 0.1: half; both: a quarter; a failure: nothing; waiting 8 s: a quarter
    assert credits == [pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.25), 0.0, pytest.approx(0.25)]


def test_memory_is_bounded_by_the_window_and_the_request_cap():
    ledger = ArrivalLedger(window_s=10, max_requests=5)
    for second in range(20):
        ledger.arrived(float(second))
    assert len(ledger) == 5 and [c.second for c in ledger.outcomes(19.0, TTFT, TPOT)] == [15, 16, 17, 18, 19]
    assert ledger.outcomes(100.0, TTFT, TPOT) == [] and len(ledger) == 0


events = st.lists(st.tuples(st.sampled_from(["arrive", "first", "end_ok", "end_fail", "cancel"]),
                            st.floats(0, 5), st.floats(0, 1)), max_size=60)


@given(events)
def test_every_counted_arrival_kept_is_in_exactly_one_count(script):
    ledger, now, live = ArrivalLedger(window_s=30, max_requests=40), 0.0, []
    for kind, step, tpot in script:
        now += step
        if kind == "arrive" or not live:
            live.append(ledger.arrived(now))
            continue
        arrival = live[int(tpot * (len(live) - 1))]
        if kind == "first":
            arrival.token(now)
        else:
            arrival.end(now, counted=kind != "cancel", served=kind == "end_ok")
    found = ledger.outcomes(now, TTFT, TPOT)
    assert sum(c.within + c.missed + c.pending for c in found) == sum(a.counted for a in ledger._arrivals)
    assert [c.second for c in found] == sorted(c.second for c in found)
    assert all(c.within - 1e-9 <= c.credit <= c.within + c.missed + 1e-9 for c in found)
