"""`LayoutMemory`: layouts, scores, stays and the dwell."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.planner_config import PlannerConfig
from scheduler.planner_memory import MARGIN, LayoutMemory, after_switch, layout_of, score, worst_miss
from scheduler.planner_signals import Signals
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
    memory.observe(SPLIT, 0.8 * (1 + MARGIN), now=0)          # better, but only by the margin
    memory.observe(COLOC, 0.8, now=1)
    assert memory.holds_back(COLOC, SPLIT, now=2)
    memory.observe(SPLIT, 0.8 * (1 + MARGIN) + 0.05, now=3)   # a new stay in the split, clearly better
    memory.observe(COLOC, 0.8, now=4)
    assert not memory.holds_back(COLOC, SPLIT, now=5)


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
