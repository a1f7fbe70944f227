"""grammar_bitmask: applying a bitmask equals the plain masked_fill reference, for sparse and dense
rows, any dtype, rows picked out of a larger batch, and masks narrower than the logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.grammar_bitmask import allocate_bitmask, allowed_tokens, apply_bitmask, unpack_bitmask


def _reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    vocab = logits.shape[1]
    for k, row in enumerate(rows):
        for token in range(vocab):
            word = token // 32
            if word >= bitmask.shape[1] or not (int(bitmask[k, word]) >> (token % 32)) & 1:
                out[row, token] = float("-inf")
    return out


def _bitmask(rng: np.random.Generator, rows: int, words: int, density: float) -> torch.Tensor:
    bits = rng.random((rows, words * 32)) < density
    return torch.from_numpy(np.packbits(bits, axis=-1, bitorder="little").view(np.int32).copy())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 5), vocab=st.integers(1, 200),
       density=st.sampled_from([0.0, 0.02, 0.5, 0.98, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_apply_bitmask_matches_the_reference(seed, batch, vocab, density, dtype):
    rng = np.random.default_rng(seed)
    rows = sorted(rng.choice(batch, size=rng.integers(1, batch + 1), replace=False).tolist())
    words = (vocab + 31) // 32 - int(rng.integers(0, 2) if vocab > 32 else 0)  # sometimes narrower
    bitmask = _bitmask(rng, len(rows), words, density)
    logits = torch.from_numpy(rng.standard_normal((batch, vocab)).astype(np.float32)).to(dtype)
    expected = _reference(logits, bitmask, rows)
    apply_bitmask(logits, bitmask, rows)
    assert torch.equal(logits, expected)


def test_non_contiguous_logits_are_written_back():
    logits = torch.randn(8, 64).t()  # [64, 8], not contiguous
    bitmask = torch.zeros(1, 1, dtype=torch.int32)
    bitmask[0, 0] = 0b101
    apply_bitmask(logits, bitmask, [3])
    assert torch.isfinite(logits[3, [0, 2]]).all() and torch.isinf(logits[3, [1, 3, 4, 7]]).all()
    assert torch.isfinite(logits[2]).all()


def test_allocate_allows_everything_and_allowed_tokens_reads_a_row():
    bitmask = allocate_bitmask(2, 70)
    assert bitmask.shape == (2, 3) and bitmask.dtype == torch.int32
    assert allowed_tokens(bitmask[0], 70) == list(range(70))
    bitmask[1] = 0
    bitmask[1, 2] = 1 << 3
    assert allowed_tokens(bitmask[1], 70) == [67]
    assert unpack_bitmask(bitmask, 100)[0, 96:].tolist() == [False] * 4  # past the mask: forbidden


def test_row_count_must_match():
    with pytest.raises(ValueError):
        apply_bitmask(torch.zeros(2, 32), allocate_bitmask(1, 32), [0, 1])
    apply_bitmask(torch.zeros(2, 32), allocate_bitmask(0, 32), [])  # nothing to do


@pytest.mark.gpu
def test_apply_bitmask_on_a_gpu_equals_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rng = np.random.default_rng(0)
    bitmask = torch.cat([_bitmask(rng, 2, 1536, 0.01), _bitmask(rng, 2, 1536, 0.99)])
    logits = torch.randn(6, 49152)
    on_gpu = logits.cuda()
    apply_bitmask(logits, bitmask, [0, 2, 3, 5])
    apply_bitmask(on_gpu, bitmask, [0, 2, 3, 5])
    assert torch.equal(on_gpu.cpu(), logits)
