"""The chunked-prefill schedule: decode tokens first, then prompt chunks within the budget (and a
decode node's cap on prompt tokens per step)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nodes.engines.base import SamplingParams
from nodes.engines.step_schedule import Sequence, schedule


def seq(name: str, num_prompt: int, num_computed: int, num_output: int = 0) -> Sequence:
    tokens = list(range(num_prompt + num_output))
    return Sequence(name, tokens, num_prompt, SamplingParams(), output=None, num_reserved_tokens=999,
                    num_computed_tokens=num_computed)


def test_decode_tokens_come_first_then_chunks_in_arrival_order():
    seqs = [seq("p1", 100, 0), seq("d1", 10, 10, 1), seq("p2", 50, 0), seq("d2", 20, 20, 1)]
    chunks = schedule(seqs, max_batch_tokens=64, prefill_chunk_tokens=40)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in chunks] == [
        ("d1", 10, 1), ("d2", 20, 1), ("p1", 0, 40), ("p2", 0, 22)]
    assert [c.samples for c in chunks] == [True, True, False, False]


def test_last_chunk_of_a_prompt_samples():
    s = seq("p", 100, 80)
    (chunk,) = schedule([s], max_batch_tokens=64, prefill_chunk_tokens=64)
    assert (chunk.start, chunk.num_tokens, chunk.samples) == (80, 20, True)


def test_empty_budget_schedules_nothing_more():
    seqs = [seq("d", 10, 10, 1), seq("p", 100, 0)]
    chunks = schedule(seqs, max_batch_tokens=1, prefill_chunk_tokens=64)
    assert [c.seq.request_id for c in chunks] == ["d"]


def test_a_step_prefill_cap_gives_one_chunk_to_the_oldest_prompt_first():
    """A decode node's cap (one chunk a step): its streams wait for one chunk, not one per prompt,
    and the oldest prompt finishes first instead of every prompt advancing together."""
    seqs = [seq("d1", 10, 10, 1), seq("p1", 100, 70), seq("p2", 100, 0), seq("d2", 20, 20, 1)]
    chunks = schedule(seqs, max_batch_tokens=2048, prefill_chunk_tokens=64, max_prefill_tokens=64)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in chunks] == [
        ("d1", 10, 1), ("d2", 20, 1), ("p1", 70, 30), ("p2", 0, 34)]
    uncapped = schedule(seqs, max_batch_tokens=2048, prefill_chunk_tokens=64)
    assert [(c.seq.request_id, c.num_tokens) for c in uncapped][2:] == [("p1", 30), ("p2", 64)]
    tight = schedule(seqs, max_batch_tokens=3, prefill_chunk_tokens=64, max_prefill_tokens=64)
    assert [(c.seq.request_id, c.num_tokens) for c in tight] == [("d1", 1), ("d2", 1), ("p1", 1)]


@given(lengths=st.lists(st.tuples(st.integers(1, 600), st.booleans()), min_size=1, max_size=12),
       budget=st.integers(1, 4096), chunk=st.integers(1, 512), cap=st.integers(0, 1024))
def test_every_step_keeps_its_budgets(lengths, budget, chunk, cap):
    seqs = [seq(f"s{i}", n, n, 1) if decoding else seq(f"s{i}", n, 0) for i, (n, decoding) in enumerate(lengths)]
    chunks = schedule(seqs, max_batch_tokens=budget, prefill_chunk_tokens=chunk, max_prefill_tokens=cap)
    prefill = [c for c in chunks if not c.seq.is_decoding]
    assert sum(c.num_tokens for c in chunks) <= budget
    assert all(0 < c.num_tokens <= chunk for c in prefill)
    assert cap == 0 or sum(c.num_tokens for c in prefill) <= cap
    decoding = [s for s in seqs if s.is_decoding]
    assert [c.seq for c in chunks if c.seq.is_decoding] == decoding[:budget]   # streams never wait behind a prompt
