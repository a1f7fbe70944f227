"""The KV benchmarks' transformers reference on a tiny random Llama: the prompt KV comes out in the
engine's layout, and the quality bench's continuations really attend to the KV they are given
(a cache passed under a keyword transformers does not know is silently ignored)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness.bench.kv_model import prompt_kv  # noqa: E402
from harness.bench.kv_quality import continuations  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_prompt_kv_is_layers_kv_heads_tokens_head_dim(tiny_llama):
    kv = prompt_kv(tiny_llama, [5, 9, 11, 3, 7])
    assert kv.shape == (2, 2, 2, 5, 8) and kv.dtype == np.float32


def test_continuations_attend_to_the_prompt_kv_they_are_given(tiny_llama):
    prompt, targets = [5, 9, 11, 3, 7, 2], [13, 17, 19]
    kv = prompt_kv(tiny_llama, prompt[:-1])
    (logp, greedy), (logp_zeroed, _) = continuations(tiny_llama, [kv, np.zeros_like(kv)], prompt[-1], targets, 4)
    with torch.inference_mode():
        full = torch.log_softmax(tiny_llama(torch.tensor([prompt + targets[:-1]])).logits[0, len(prompt) - 1:], -1)
    torch.testing.assert_close(logp, full, atol=1e-4, rtol=1e-4)   # same as running the whole text
    assert not torch.allclose(logp, logp_zeroed, atol=1e-3)          # and other KV changes them
    assert len(greedy) == 4
