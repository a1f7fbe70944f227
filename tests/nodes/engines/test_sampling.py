"""Sampling: greedy, seeds, top-k/top-p support, batch independence."""

from __future__ import annotations

import torch

from nodes.engines.base import SamplingParams
from nodes.engines.sampling import greedy_tokens, new_generator, sample


def logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    x = logits()
    assert sample(x, [SamplingParams(temperature=0)] * 4, [None] * 4) == x.argmax(-1).tolist()


def test_seed_reproduces_and_ignores_batch_neighbours():
    x = logits()
    p = SamplingParams(temperature=1.0, seed=7)
    alone = [sample(x[1:2], [p], [g])[0] for g in [new_generator(7)] for _ in range(1)]
    gens = [new_generator(1), new_generator(7), None, new_generator(3)]
    mixed = sample(x, [SamplingParams(temperature=1.0, seed=s) for s in (1, 7, None, 3)], gens)
    assert mixed[1] == alone[0]
    g1, g2 = new_generator(7), new_generator(7)
    seq1 = [sample(x[:1], [p], [g1])[0] for _ in range(20)]
    seq2 = [sample(x[:1], [p], [g2])[0] for _ in range(20)]
    assert seq1 == seq2 and len(set(seq1)) > 1


def test_top_k_restricts_support():
    x = logits(1, 50)
    top3 = set(x[0].topk(3).indices.tolist())
    g = new_generator(0)
    drawn = {sample(x, [SamplingParams(temperature=5.0, top_k=3)], [g])[0] for _ in range(200)}
    assert drawn <= top3 and len(drawn) == 3


def test_top_p_keeps_the_nucleus_only():
    x = torch.tensor([[10.0, 9.0, 0.0, -5.0]])   # p = 0.73, 0.27, ~0, ~0
    g = new_generator(0)
    drawn = {sample(x, [SamplingParams(top_p=0.9)], [g])[0] for _ in range(200)}
    assert drawn == {0, 1}
    drawn = {sample(x, [SamplingParams(top_p=0.5)], [g])[0] for _ in range(50)}
    assert drawn == {0}


def test_mixed_batch_greedy_rows_unaffected():
    x = logits()
    params = [SamplingParams(temperature=0), SamplingParams(top_k=5, seed=1), SamplingParams(temperature=0),
              SamplingParams(top_p=0.8, seed=2)]
    out = sample(x, params, [None, new_generator(1), None, new_generator(2)])
    assert out[0] == x[0].argmax() and out[2] == x[2].argmax()


def test_greedy_tokens_match_torch_argmax_on_ties_nan_and_views():
    scores = torch.randn(6, 1000, generator=torch.Generator().manual_seed(3))
    scores[0, [10, 20]] = 50.0                      # a tie: the first index wins, as in torch
    scores[1, 7] = float("nan")                     # a NaN counts as the maximum, as in torch
    scores[2] = float("-inf")
    scores[2, 999] = 0.0
    for case in (scores, scores[:, ::2], scores.T.contiguous().T, scores.to(torch.bfloat16)):
        assert greedy_tokens(case) == case.argmax(dim=-1).tolist()
    assert greedy_tokens(scores)[:3] == [10, 7, 999]
