"""`LayoutMemory`: layouts, scores, stays and the dwell."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.planner_config import PlannerConfig
from scheduler.planner_memory import MARGIN, LayoutMemory, after_switch, layout_of, score, worst_miss
from scheduler.planner_signals import ArrivalCount, Signals
from tests.scheduler.planner_helpers import decode_cap, prefill_cap, snap, stats_body

TARGETS = PlannerConfig(ttft_p90_target_s=2.0, tpot_p90_target_s=0.05)
SPLIT, COLOC = (1, 1, 0), (0, 2, 0)


def test_a_layout_counts_the_nodes_of_each_role_that_are_not_draining():
    body = stats_body({"p0": ("prefill", prefill_cap()), "p1": ("prefill", prefill_cap(draining=1)),
                       "d0": ("decode", decode_cap()), "b0": ("both", decode_cap())})
    assert layout_of(snap(body)) == (1, 1, 1)
    assert after_switch((1, 1, 0), "prefill", "decode") == COLOC


@pytest.mark.parametrize(("signals", "expected"), [
    (Signals(slo_attainment=0.7, ttft_p90_s=9.0), 0.7),          # attainment first
    (Signals(ttft_p90_s=1.0, tpot_p90_s=0.04), 1.0),             # on target: 1, not more
    (Signals(ttft_p90_s=4.0, tpot_p90_s=0.04), 0.5),             # 2x the TTFT target
    (Signals(ttft_p90_s=1.0, tpot_p90_s=0.2), 0.25),             # 4x the TPOT target
    (Signals(), None),
])
def test_score_is_attainment_else_the_inverse_of_the_worst_miss(signals, expected):
    assert score(signals, TARGETS) == (pytest.approx(expected) if expected is not None else None)


def test_without_targets_no_miss_is_known():
    assert worst_miss(Signals(ttft_p90_s=5.0, tpot_p90_s=1.0), PlannerConfig()) is None
    assert score(Signals(ttft_p90_s=5.0), PlannerConfig()) is None


def test_a_layout_left_within_the_dwell_is_returned_to_only_if_it_scored_clearly_better():
    memory = LayoutMemory(dwell_s=100)
    memory.observe(SPLIT, 0.5, now=0)
    memory.observe(COLOC, 0.8, now=10)
    assert memory.holds_back(COLOC, SPLIT, now=20)            # scored worse
    assert not memory.holds_back(COLOC, SPLIT, now=111)       # the evidence is older than the dwell
    assert not memory.holds_back(COLOC, (2, 0, 0), now=20)    # never seen: try it


def test_about_as_good_is_not_reason_enough_to_flip_back():
    memory = LayoutMemory(dwell_s=100)
    memory.observe(SPLIT, 1 - 0.2 * (1 - MARGIN), now=0)      # misses less, but only by the margin
    memory.observe(COLOC, 0.8, now=1)
    assert memory.holds_back(COLOC, SPLIT, now=2)
    memory.observe(SPLIT, 0.9, now=3)                         # a new stay in the split: half the misses
    memory.observe(COLOC, 0.8, now=4)
    assert not memory.holds_back(COLOC, SPLIT, now=5)


@pytest.mark.parametrize(("there", "here", "held"), [
    (0.98, 0.89, False),   # bench-elastic 12-06 03:01: a fifth of the misses, held by a ratio of scores
    (0.42, 0.40, True),    # past capacity, alike
    (0.05, 0.00, True),    # nothing met anywhere: no evidence
    (0.40, 0.10, False),   # credit: nearer the targets
    (0.95, 0.97, False),   # it served well there: moves between layouts that serve are free
    (0.85, 0.86, True),
])
def test_the_margin_is_on_the_misses(there, here, held):
    memory = LayoutMemory(dwell_s=100)
    memory.observe(SPLIT, there, now=0)
    memory.observe(COLOC, here, now=1)
    assert memory.holds_back(COLOC, SPLIT, now=2) is held


def test_a_stay_is_judged_by_its_whole_mean_and_a_new_stay_forgets_the_old():
    memory = LayoutMemory(dwell_s=1000)
    memory.observe(SPLIT, 0.2, now=0)
    memory.observe(COLOC, 0.6, now=1)
    memory.observe(SPLIT, 0.9, now=2)      # back in the split: it does well now
    assert memory.means()[SPLIT] == pytest.approx(0.9)
    memory.observe(SPLIT, 0.3, now=3)      # the stay's mean, not its last score
    assert memory.means()[SPLIT] == pytest.approx(0.6)


def test_a_current_layout_not_observed_in_this_stay_holds_nothing_back():
    memory = LayoutMemory(dwell_s=1000)
    memory.observe(COLOC, 0.9, now=0)
    memory.observe(SPLIT, 0.3, now=1)
    assert not memory.holds_back(COLOC, SPLIT, now=2)   # the planner is in the split, not the pair
    memory.observe(SPLIT, None, now=3)                  # no signal: nothing recorded
    assert memory.holds_back(SPLIT, (2, 0, 0), now=4) is False


@given(st.lists(st.tuples(st.sampled_from([SPLIT, COLOC]), st.floats(0, 1)), min_size=1, max_size=30))
def test_means_stay_within_what_was_observed(observations):
    memory = LayoutMemory(dwell_s=1000)
    for now, (layout, value) in enumerate(observations):
        memory.observe(layout, value, now)
    for mean in memory.means().values():
        assert 0.0 <= mean <= 1.0


def arrivals(start: float, seconds: int, within: int, missed: int, credit: float = 0.0) -> tuple[ArrivalCount, ...]:
    """`seconds` seconds of arrivals from `start`; each miss earning `credit` of its targets."""
    return tuple(ArrivalCount(start + i, within, missed, within + missed * credit) for i in range(seconds))


def test_with_enough_known_outcomes_stays_are_scored_by_their_arrivals():
    memory = LayoutMemory(dwell_s=600)
    memory.observe(COLOC, 0.05, now=100, arrivals=arrivals(100, 50, within=9, missed=1))
    memory.left(150)
    memory.observe(SPLIT, 0.9, now=160, arrivals=arrivals(100, 100, within=9, missed=1)[:60]
                   + arrivals(160, 40, within=4, missed=6))
    assert memory.scores(SPLIT, COLOC, now=200) == (pytest.approx(0.4), pytest.approx(0.9), "arrivals")
    assert not memory.holds_back(SPLIT, COLOC, now=200)   # by the windows (0.05 vs 0.9) it would be


def test_past_capacity_the_layout_nearer_its_targets_scores_higher():
    memory = LayoutMemory(dwell_s=600)
    memory.observe(COLOC, 0.0, now=0, arrivals=arrivals(0, 20, within=0, missed=3, credit=0.4))
    memory.left(20)
    memory.observe(SPLIT, 0.0, now=30, arrivals=arrivals(30, 20, within=0, missed=3, credit=0.1))
    assert memory.scores(SPLIT, COLOC, now=50) == (pytest.approx(0.1), pytest.approx(0.4), "arrivals")
    assert not memory.holds_back(SPLIT, COLOC, now=50)   # nothing met its SLO, but the pair came nearer


def test_the_seconds_of_a_switch_count_for_neither_layout():
    memory = LayoutMemory(dwell_s=600)
    memory.observe(SPLIT, 0.5, now=0, arrivals=arrivals(0, 10, within=1, missed=0))
    memory.left(10)
    memory.observe(COLOC, 0.5, now=60, arrivals=arrivals(10, 50, within=0, missed=5)   # the drain
                   + arrivals(60, 10, within=1, missed=1))
    here, there, basis = memory.scores(COLOC, SPLIT, now=70)
    assert (here, there, basis) == (pytest.approx(0.5), pytest.approx(1.0), "arrivals")


def test_too_few_known_outcomes_are_nothing_to_go_by_and_outcomes_are_updated():
    memory = LayoutMemory(dwell_s=600)
    memory.observe(SPLIT, 0.3, now=0, arrivals=arrivals(0, 3, within=1, missed=0))   # 3 < MIN_JUDGED
    memory.observe(COLOC, 0.6, now=10, arrivals=arrivals(10, 20, within=1, missed=0))
    assert memory.scores(COLOC, SPLIT, now=30) is None   # not the windows: they hold the split's queue
    memory.observe(COLOC, 0.6, now=31, arrivals=arrivals(0, 9, within=0, missed=1))   # they resolved: missed
    assert memory.scores(COLOC, SPLIT, now=32)[2] == "arrivals"
    assert memory.scores(COLOC, SPLIT, now=32)[1] == pytest.approx(0.0)


def test_outcomes_older_than_every_stay_within_the_dwell_are_forgotten():
    memory = LayoutMemory(dwell_s=100)
    memory.observe(SPLIT, 0.5, now=0, arrivals=arrivals(-500, 510, within=1, missed=0))
    assert len(memory._outcomes) <= 12
    memory.observe(COLOC, 0.5, now=300, arrivals=arrivals(290, 10, within=1, missed=0))
    assert min(memory._outcomes) >= 299


@given(st.lists(st.tuples(st.sampled_from([SPLIT, COLOC]), st.floats(0, 1) | st.none(),
                          st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5), st.integers(0, 5), st.floats(0, 1)),
                                   max_size=8),
                          st.booleans()), min_size=1, max_size=30))
def test_scores_stay_within_what_can_be_attained(rounds):
    memory = LayoutMemory(dwell_s=1000)
    for now, (layout, value, seconds, leave) in enumerate(rounds):
        memory.observe(layout, value, float(now),
                       tuple(ArrivalCount(float(at), w, m, w + m * c) for at, w, m, c in seconds) or None)
        if leave:
            memory.left(float(now))
        for there in (SPLIT, COLOC):
            found = memory.scores(layout, there, float(now))
            assert found is None or (0.0 <= found[0] <= 1.0 and 0.0 <= found[1] <= 1.0)
