"""The chunked-prefill schedule: decode tokens first, then prompt chunks within the budget."""

from __future__ import annotations

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
