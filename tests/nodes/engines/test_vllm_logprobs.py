"""vLLM's logprobs read as pdbus's (nodes/engines/vllm_convert.passed_logprobs), without vLLM: its
{token id: Logprob(logprob, rank)} per position holds the top k by rank and the chosen token."""

from __future__ import annotations

from types import SimpleNamespace

from nodes.engines.base import TokenLogprobs
from nodes.engines.vllm_convert import passed_logprobs


def lp(value: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=rank)


def test_the_top_k_by_rank_and_the_chosen_tokens_own_value():
    positions = [{5: lp(-0.1, 1), 9: lp(-2.5, 2), 7: lp(-6.0, 40)}]
    assert passed_logprobs(positions, 0, 7, 2) == TokenLogprobs(-6.0, ((5, -0.1), (9, -2.5)))
    assert passed_logprobs(positions, 0, 5, 1) == TokenLogprobs(-0.1, ((5, -0.1),))
    assert passed_logprobs(positions, 0, 5, 0) == TokenLogprobs(-0.1, ())


def test_nothing_where_vllm_has_nothing():
    assert passed_logprobs(None, 0, 5, 2) is None
    assert passed_logprobs([None, {5: lp(-1.0, 1)}], 0, 5, 2) is None    # the first prompt token
    assert passed_logprobs([{5: lp(-1.0, 1)}], 0, 5, None) is None      # not asked
