"""Chunked prefill (`ChunkedPrefill`, `Engine.start_prefill`): the chunk plan, results equal to one
whole pass (float32: same token ids, KV equal to rounding: bit-equal when a chunk holds the whole
batch, and for the real model's 512-token prompt in chunks of 256), cancellation mid-pass, and the
contract's default pass for engines that cannot stop inside a pass."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import Engine, PrefillRequest, SamplingParams, WholePrefill
from nodes.engines.prefill_pass import ChunkedPrefill, plan_chunk
from tests.nodes.engines.engine_helpers import make_engine

GREEDY = SamplingParams(temperature=0.0)
# Chunking changes how many rows each matmul sees, which may round the last bit differently (the
# tiny model: at most 2.1e-7 absolute on KV of magnitude ~1, so 1e-6 leaves room, nothing more).
KV_ATOL = 1e-6


def prompts(vocab_size: int, lengths=(37, 100, 5, 64), seed: int = 0) -> list[PrefillRequest]:
    generator = torch.Generator().manual_seed(seed)
    return [PrefillRequest(f"r{i}", tuple(torch.randint(0, vocab_size, (n,), generator=generator).tolist()), GREEDY)
            for i, n in enumerate(lengths)]


def run_to_end(prefill) -> dict[str, object]:
    results, num_steps = {}, 0
    while not prefill.done:
        results.update((r.request_id, r) for r in prefill.step())
        num_steps += 1
        assert num_steps < 10_000
    return results


def test_plan_chunk_packs_the_next_tokens_in_order_and_cuts_the_last_span():
    assert plan_chunk([(10, 0), (20, 0)], 16) == [(0, 0, 10), (1, 0, 6)]
    assert plan_chunk([(10, 10), (20, 6)], 16) == [(1, 6, 14)]
    assert plan_chunk([(600, 256)], 256) == [(0, 256, 256)]
    assert plan_chunk([(3, 0), (3, 0), (3, 0)], 4) == [(0, 0, 3), (1, 0, 1)]
    assert plan_chunk([(5, 5)], 4) == [] and plan_chunk([], 4) == []


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 64, 100, 206, 4096])
def test_chunked_results_equal_one_whole_pass(tiny_model, chunk_tokens):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)   # prompts repeat: chunking alone
    requests = prompts(tiny_model.config.vocab_size)
    whole = {r.request_id: r for r in engine.prefill(requests)}
    chunked = run_to_end(engine.start_prefill(requests, chunk_tokens=chunk_tokens))
    assert chunked.keys() == whole.keys()
    for request_id, result in chunked.items():
        expected = whole[request_id]
        assert (result.first_token_id, result.text, result.num_prompt_tokens, result.finish_reason) == (
            expected.first_token_id, expected.text, expected.num_prompt_tokens, expected.finish_reason)
        assert result.kv.shape == expected.kv.shape
        if chunk_tokens >= sum(len(r.prompt_token_ids) for r in requests):   # one pass: the same computation
            assert torch.equal(result.kv, expected.kv)
        torch.testing.assert_close(result.kv, expected.kv, atol=KV_ATOL, rtol=0)


def test_each_step_computes_at_most_chunk_tokens_and_results_come_when_a_prompt_ends(tiny_model):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)   # prompts repeat: chunking alone
    requests = prompts(tiny_model.config.vocab_size, lengths=(10, 30))
    prefill = engine.start_prefill(requests, chunk_tokens=16)
    before = engine.stats.num_prefilled_tokens
    assert prefill.num_remaining_tokens == 40 and not prefill.done
    assert [r.request_id for r in prefill.step()] == ["r0"] and prefill.num_remaining_tokens == 24
    assert prefill.step() == [] and prefill.num_remaining_tokens == 8
    assert [r.request_id for r in prefill.step()] == ["r1"] and prefill.done and prefill.num_remaining_tokens == 0
    assert prefill.step() == [] and engine.stats.num_prefilled_tokens - before == 40


def test_a_prompt_cancelled_mid_pass_stops_and_the_others_are_unchanged(tiny_model):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)   # prompts repeat: chunking alone
    requests = prompts(tiny_model.config.vocab_size, lengths=(20, 20, 20))
    whole = {r.request_id: r for r in engine.prefill(requests)}
    prefill = engine.start_prefill(requests, chunk_tokens=30)
    assert [r.request_id for r in prefill.step()] == ["r0"]   # r1 is 10 tokens in
    assert prefill.cancel("r1") and not prefill.cancel("r1") and not prefill.cancel("r0")
    assert prefill.num_remaining_tokens == 20
    rest = run_to_end(prefill)
    assert list(rest) == ["r2"] and rest["r2"].first_token_id == whole["r2"].first_token_id
    torch.testing.assert_close(rest["r2"].kv, whole["r2"].kv, atol=KV_ATOL, rtol=0)


def test_bad_requests_and_chunk_sizes_fail_when_the_pass_starts(tiny_model):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)   # prompts repeat: chunking alone
    with pytest.raises(ValueError, match="chunk_tokens"):
        engine.start_prefill(prompts(tiny_model.config.vocab_size), chunk_tokens=0)
    with pytest.raises(ValueError, match="empty prompt"):
        engine.start_prefill([PrefillRequest("r", ())], chunk_tokens=8)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.start_prefill([PrefillRequest("r", (10**6,))], chunk_tokens=8)


def test_the_default_pass_runs_prefill_whole_in_one_step():
    class WholeOnly:   # an engine with only `prefill` (like the vLLM engine)
        def __init__(self):
            self.calls = []

        def prefill(self, requests):
            self.calls.append([r.request_id for r in requests])
            return [f"result-{r.request_id}" for r in requests]

    engine = WholeOnly()
    prefill = Engine.start_prefill(engine, [PrefillRequest("a", (1, 2)), PrefillRequest("b", (3,))], chunk_tokens=1)
    assert isinstance(prefill, WholePrefill) and prefill.num_remaining_tokens == 3 and not prefill.done
    assert prefill.cancel("b") and not prefill.cancel("b")
    assert prefill.step() == ["result-a"] and prefill.done and prefill.num_remaining_tokens == 0
    assert prefill.step() == [] and engine.calls == [["a"]]


@pytest.mark.real_model
def test_real_model_512_token_prompt_in_chunks_of_256_equals_one_pass(smollm2):
    engine = make_engine(smollm2, prefix_cache_bytes=0)
    (request,) = prompts(smollm2.config.vocab_size, lengths=(512,), seed=1)
    (whole,) = engine.prefill([request])
    prefill = engine.start_prefill([request], chunk_tokens=256)
    assert prefill.step() == [] and prefill.num_remaining_tokens == 256
    (chunked,) = prefill.step()
    assert chunked.first_token_id == whole.first_token_id
    # Measured bit-equal on this CPU (float32); the tolerance only allows a different last bit.
    torch.testing.assert_close(chunked.kv, whole.kv, atol=1e-5 * float(whole.kv.abs().max()), rtol=0)


def test_chunked_prefill_is_its_own_class_with_the_engine_runner(tiny_model):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)   # prompts repeat: chunking alone
    assert isinstance(engine.start_prefill(prompts(tiny_model.config.vocab_size), chunk_tokens=8), ChunkedPrefill)
