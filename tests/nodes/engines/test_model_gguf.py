"""GGUF reading: tiny round trip, the q/k un-permutation, and the real SmolLM2 against transformers."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.gguf_reader import permute_rope_rows, read_gguf, unpermute_rope_rows
from nodes.engines.model_loader import packaged_gguf_path


def test_tiny_gguf_reads_back_the_weights_config_and_tokenizer(tiny_gguf, tiny_model):
    model = read_gguf(tiny_gguf)
    assert model.config == tiny_model.config and model.name == "tiny-test"
    assert model.weights.keys() == tiny_model.weights.keys()
    assert all(torch.equal(model.weights[k], tiny_model.weights[k]) for k in model.weights)
    text = "Hello 😀 ünï <|im_start|>user\nhi<|im_end|>"
    assert model.tokenizer.encode(text) == tiny_model.tokenizer.encode(text)
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == \
        tiny_model.tokenizer.apply_chat_template([{"role": "user", "content": "x"}])


def test_add_bos_token_flag_makes_encode_start_with_bos(tmp_path, tiny_model):
    from .conftest import write_tiny_gguf

    tokenizer = read_gguf(write_tiny_gguf(tmp_path / "bos.gguf", tiny_model, add_bos_token=True)).tokenizer
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, *tokenizer.encode("hi")]


def test_read_gguf_converts_to_the_requested_dtype(tiny_gguf):
    weights = read_gguf(tiny_gguf, torch.bfloat16).weights
    assert all(t.dtype == torch.bfloat16 for t in weights.values())


def test_unpermute_inverts_llama_cpp_permute():
    weight = torch.randn(6 * 8, 20)
    assert torch.equal(unpermute_rope_rows(permute_rope_rows(weight, 6), 6), weight)
    assert not torch.equal(permute_rope_rows(weight, 6), weight)


def _rotate_half_rope(x, positions, theta=10000.0):  # HF: rotate first half against second half
    half = x.shape[-1] // 2
    freqs = positions[:, None] * theta ** (-torch.arange(half) / half)
    cos, sin = torch.cat([freqs.cos()] * 2, -1), torch.cat([freqs.sin()] * 2, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _interleaved_rope(x, positions, theta=10000.0):  # llama.cpp: rotate adjacent pairs
    half = x.shape[-1] // 2
    freqs = positions[:, None] * theta ** (-torch.arange(half) / half)
    pairs = x.reshape(*x.shape[:-1], half, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    out = torch.stack([even * freqs.cos() - odd * freqs.sin(), even * freqs.sin() + odd * freqs.cos()], -1)
    return out.reshape(x.shape)


def test_unpermuted_weights_give_the_same_attention_scores_under_hf_rope():
    """The GGUF layout under llama.cpp's RoPE and our HF layout under HF's RoPE see the same scores."""
    torch.manual_seed(0)
    head_dim, hidden, tokens = 16, 32, 7
    q_hf, k_hf = torch.randn(head_dim, hidden, dtype=torch.float64), torch.randn(head_dim, hidden, dtype=torch.float64)
    x = torch.randn(tokens, hidden, dtype=torch.float64)
    positions = torch.arange(tokens, dtype=torch.float64)
    scores_hf = _rotate_half_rope(x @ q_hf.T, positions) @ _rotate_half_rope(x @ k_hf.T, positions).T
    q_gguf, k_gguf = permute_rope_rows(q_hf, 1), permute_rope_rows(k_hf, 1)
    scores_gguf = _interleaved_rope(x @ q_gguf.T, positions) @ _interleaved_rope(x @ k_gguf.T, positions).T
    torch.testing.assert_close(scores_hf, scores_gguf)
    assert torch.equal(unpermute_rope_rows(q_gguf, 1), q_hf)


@pytest.mark.real_model
def test_cached_real_model_equals_a_direct_gguf_read(smollm2):
    direct = read_gguf(packaged_gguf_path())
    assert smollm2.config == direct.config
    assert smollm2.config.num_layers == 30 and smollm2.config.num_kv_heads == 3 and smollm2.config.head_dim == 64
    assert smollm2.weights.keys() == direct.weights.keys()
    assert all(torch.equal(smollm2.weights[k], direct.weights[k]) for k in direct.weights)
    assert smollm2.num_params == 134_515_008 and smollm2.name == "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def transformers_gguf_model():
    transformers = pytest.importorskip("transformers")
    path = packaged_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                             dtype=torch.float32)


@pytest.mark.slow
@pytest.mark.real_model
def test_real_weights_equal_transformers_gguf_load_tensor_by_tensor(smollm2, transformers_gguf_model):
    """transformers dequantizes and un-permutes on its own; equality proves our layout is HF's."""
    reference = transformers_gguf_model.state_dict()
    assert set(reference) - set(smollm2.weights) == {"lm_head.weight"}  # tied: a view of the embeddings
    for name, tensor in smollm2.weights.items():
        assert torch.equal(tensor, reference[name]), name
    hf_config = transformers_gguf_model.config
    assert (hf_config.num_hidden_layers, hf_config.num_key_value_heads, hf_config.vocab_size) == (30, 3, 49152)
    assert hf_config.tie_word_embeddings == smollm2.config.tie_word_embeddings
