"""The step budget (nodes/engines/step_budget.py): prompt tokens per step sized from measured costs
so a step with streams ends within its target; the cap alone where nothing is known or at stake."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from nodes.engines.step_budget import REFRESH_STEPS, StepBudget


def measured(target_s=0.1, cap=256, decode_s=0.04, token_s=0.001) -> StepBudget:
    budget = StepBudget(target_s, cap)
    budget.observe(decode_s, 3, 0)
    budget.observe(decode_s + 100 * token_s, 3, 100)
    return budget


def test_the_target_leaves_room_for_what_the_decode_tokens_take():
    budget = measured()
    assert (budget.decode_s, budget.prefill_token_s) == (0.04, 0.001)
    assert budget.tokens(num_decoding=3) == 60            # (0.1 - 0.04) / 0.001
    assert measured(target_s=0.5).tokens(3) == 256        # never above the cap
    assert measured(target_s=0.5, cap=0).tokens(3) == 460
    assert measured(target_s=0.03).tokens(3) == 40        # decode alone is over: the prompt gets as long
    assert measured(target_s=0.07).tokens(3) == 40        # ...and never less: a step's half at least


def test_without_streams_target_or_costs_the_cap_holds():
    assert measured().tokens(num_decoding=0) == 256       # no stream waits for this step
    assert measured(target_s=0).tokens(3) == 256
    fresh = StepBudget(0.1, 256)
    assert fresh.tokens(3) == 256
    fresh.observe(0.04, 3, 0)
    assert fresh.tokens(3) == 256                         # the prompt-token cost is still unknown


def test_costs_are_smoothed_and_follow_change():
    budget = measured()
    for _ in range(30):
        budget.observe(0.08, 6, 0)                        # the batch grew: decode steps take longer
    assert math.isclose(budget.decode_s, 0.08, rel_tol=0.001)
    assert 79 <= budget.tokens(6) <= 80                   # 20 would fit in the target: the floor, ~80, holds
    budget.observe(0.01, 6, 50)                           # faster than decode alone: counted as 0 per token
    assert budget.prefill_token_s < 0.001
    budget.observe(-1.0, 6, 50)                           # a clock that went back is ignored
    budget.observe(0.5, 0, 0)
    assert budget.decode_s < 0.081


@given(target=st.floats(0, 1), cap=st.integers(0, 4096), steps=st.lists(
    st.tuples(st.floats(0, 2), st.integers(0, 64), st.integers(0, 4096)), max_size=30), num_decoding=st.integers(0, 64))
def test_the_budget_is_always_within_its_floor_and_cap(target, cap, steps, num_decoding):
    budget = StepBudget(target, cap)
    for elapsed, num_decode, num_prefill in steps:
        budget.observe(elapsed, num_decode, num_prefill)
    tokens = budget.tokens(num_decoding)
    assert tokens == cap if (num_decoding == 0 or target == 0) else tokens >= 0
    if cap:
        assert tokens <= cap
        assert tokens >= min(cap, budget.min_tokens)
    assert 1.0 <= budget.pace(num_decoding) <= 2.0 + 1e-6 or (cap and tokens == cap)


def test_the_pace_is_a_step_s_time_over_its_prompt_tokens_share():
    budget = measured()                                   # 60 tokens (60 ms) beside 40 ms of decode
    assert math.isclose(budget.pace(num_decoding=3), 100 / 60)
    assert budget.pace(num_decoding=0) == 1.0             # alone: as fast as a prefill node
    assert StepBudget(0.1, 256).pace(3) == 1.0            # nothing measured yet
    assert math.isclose(measured(target_s=0).pace(3), 1 + 40 / 256)   # the cap alone: one chunk a step
    assert measured(target_s=0, cap=0).pace(3) == 1.0     # unbounded: the prompt takes the step


def test_every_eighth_mixed_step_runs_decode_only_to_keep_the_decode_time_current():
    """A decode time measured before the batch grew would be charged to the prompt tokens: 40 ms
    measured, 80 ms true, 60 tokens at 1 ms in 140 ms read as 1.67 ms a token, the budget shrinking."""
    budget = measured()
    plan = []
    for _ in range(4 * REFRESH_STEPS + 4):
        tokens = budget.next_step(num_decoding=6)
        plan.append(tokens)
        budget.observe(0.08 + (tokens or 0) * 0.001, 6, tokens or 0)
    zeros = [i for i, tokens in enumerate(plan) if tokens == 0]
    assert len(zeros) == 4 and {b - a for a, b in zip(zeros, zeros[1:], strict=False)} == {REFRESH_STEPS + 1}
    assert budget.decode_s > 0.075 and budget.prefill_token_s < 0.0013   # converging, not spiralling
    assert budget.next_step(num_decoding=0) == 256           # no stream: nothing to measure for
    assert StepBudget(0.0, 0).next_step(6) is None           # no target, no cap: unbounded
