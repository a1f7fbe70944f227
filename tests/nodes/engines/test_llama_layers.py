"""A prompt's layers split across two runners (LlamaRunner.run_layers): the first runner computes
layers [0, S) of each chunk, only the hidden states cross, the second computes [S, L) and the
logits. Chunk by chunk, as a pipeline would run it, the result equals one runner's whole prefill:
the same logits and next token, and between them the two runners hold the whole prompt's KV."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.forward_batch import ForwardBatch, PrefillSpan
from nodes.engines.llama import LlamaRunner

PROMPT = torch.arange(3, 3 + 37) % 500


def prefill_batch(kv: torch.Tensor, start: int, num_tokens: int, last: bool) -> ForwardBatch:
    ids = PROMPT[start:start + num_tokens]
    rows = torch.tensor([num_tokens - 1]) if last else torch.tensor([], dtype=torch.long)
    return ForwardBatch(ids, torch.arange(start, start + num_tokens), rows,
                        spans=[PrefillSpan(0, num_tokens, start, kv)])


def whole(runner: LlamaRunner) -> tuple[torch.Tensor, torch.Tensor]:
    kv = runner.new_kv(64)
    logits = runner.forward(prefill_batch(kv, 0, len(PROMPT), last=True))
    return logits, kv[:, :, :, :len(PROMPT)]


def split(first: LlamaRunner, second: LlamaRunner, at_layer: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    num_layers = first.config.num_layers
    kv_first, kv_second = first.new_kv(64), second.new_kv(64)
    logits = torch.empty(0)
    for start in range(0, len(PROMPT), chunk):
        size = min(chunk, len(PROMPT) - start)
        last = start + size == len(PROMPT)
        batch_first = prefill_batch(kv_first, start, size, last)
        hidden = first.run_layers(first.embed[batch_first.token_ids], batch_first, range(at_layer))
        batch_second = prefill_batch(kv_second, start, size, last)
        crossed = hidden.clone()   # what a wire carries: a copy
        logits = second.head(second.run_layers(crossed, batch_second, range(at_layer, num_layers)), batch_second)
    kv = torch.cat([kv_first[:at_layer], kv_second[at_layer:]])
    return logits, kv[:, :, :, :len(PROMPT)]


@pytest.mark.parametrize("at_layer, chunk", [(1, 37), (1, 8), (0, 16), (2, 5)])
def test_a_prompt_split_by_layers_across_two_runners_equals_one_runners_prefill(tiny_model, at_layer, chunk):
    runners = [LlamaRunner(tiny_model.config, tiny_model.weights) for _ in range(2)]
    expected_logits, expected_kv = whole(runners[0])
    logits, kv = split(*runners, at_layer=at_layer, chunk=chunk)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv, expected_kv, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), expected_logits.argmax(-1))


def test_in_bf16_the_split_matches_within_bf16_rounding(tiny_model):
    runners = [LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16) for _ in range(2)]
    expected_logits, expected_kv = whole(runners[0])
    logits, kv = split(*runners, at_layer=1, chunk=16)
    scale = float(expected_logits.abs().max())
    torch.testing.assert_close(logits, expected_logits, atol=0.05 * scale, rtol=0)
    torch.testing.assert_close(kv.float(), expected_kv.float(), atol=0.05 * float(expected_kv.abs().max()), rtol=0)


def test_an_intermediate_chunk_samples_nothing(tiny_model):
    runner = LlamaRunner(tiny_model.config, tiny_model.weights)
    batch = prefill_batch(runner.new_kv(64), 0, 8, last=False)
    logits = runner.head(runner.run_layers(runner.embed[batch.token_ids], batch), batch)
    assert logits.shape == (0, tiny_model.config.vocab_size)
