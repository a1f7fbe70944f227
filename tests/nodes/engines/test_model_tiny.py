"""The tiny random model: deterministic per seed, HF Llama names and shapes, working tokenizer."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import torch

from nodes.engines.model_config import LlamaConfig
from nodes.engines.model_loader import build_tiny_model, load_model


def test_same_seed_gives_identical_weights_and_other_seed_differs():
    first, again, other = build_tiny_model(seed=0), build_tiny_model(seed=0), build_tiny_model(seed=1)
    assert first.weights.keys() == again.weights.keys() == other.weights.keys()
    assert all(torch.equal(first.weights[k], again.weights[k]) for k in first.weights)
    assert not torch.equal(first.weights["model.embed_tokens.weight"], other.weights["model.embed_tokens.weight"])


def test_weight_names_and_shapes_follow_hf_llama(tiny_model):
    cfg = tiny_model.config
    w = tiny_model.weights
    assert cfg.head_dim == 16 and cfg.num_queries_per_kv == 2 and cfg.tie_word_embeddings
    assert w["model.embed_tokens.weight"].shape == (512, 64)
    assert w["model.layers.1.self_attn.q_proj.weight"].shape == (64, 64)
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert w["model.layers.1.self_attn.o_proj.weight"].shape == (64, 64)
    assert w["model.layers.0.mlp.down_proj.weight"].shape == (64, 128)
    assert "lm_head.weight" not in w and "model.layers.2.mlp.up_proj.weight" not in w
    assert len(w) == 2 * 9 + 2
    assert torch.equal(w["model.norm.weight"], torch.ones(64))
    assert 0.015 < w["model.embed_tokens.weight"].std().item() < 0.025


def test_dtype_and_custom_sizes():
    model = build_tiny_model(dtype=torch.bfloat16, num_layers=3, hidden_size=96, num_heads=6, num_kv_heads=3)
    assert model.dtype == torch.bfloat16 and model.config.num_layers == 3 and model.config.head_dim == 16
    assert model.weights["model.layers.2.self_attn.v_proj.weight"].shape == (48, 96)


def test_load_model_tiny_spec_is_seed_zero(tiny_model):
    loaded = load_model("tiny")
    assert loaded.name == "tiny" and loaded.source == "random"
    assert torch.equal(loaded.weights["model.layers.0.mlp.up_proj.weight"],
                       tiny_model.weights["model.layers.0.mlp.up_proj.weight"])


def test_tiny_tokenizer_round_trips_text_and_decodes_every_id(tiny_model):
    tok = tiny_model.tokenizer
    text = "Hello world, the prefill node! ünïcode 😀 def f(x):\n\treturn 42"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == tiny_model.config.vocab_size
    assert all(tok.backend.id_to_token(i) is not None for i in range(tok.vocab_size))
    assert tok.eos_token_ids == (2,) and tok.bos_token_id == 1
    assert tok.encode("<|im_end|>") == [2]


def test_tiny_chat_template_is_chatml(tiny_model):
    prompt = tiny_model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_config_rejects_heads_not_divisible_by_kv_heads():
    with pytest.raises(ValueError, match="multiple"):
        LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3,
                    num_kv_heads=2, head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4,
                    max_position_embeddings=8, tie_word_embeddings=True, bos_token_id=None,
                    eos_token_ids=())


def test_config_round_trips_through_hf_dict(tiny_model):
    cfg = tiny_model.config
    assert LlamaConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_another_process_builds_the_identical_tiny_model(tiny_model):
    """Prefill and decode nodes run in different processes; both must build the same model."""
    script = ("import hashlib; from nodes.engines.model_loader import build_tiny_model; m = build_tiny_model();"
              "print(hashlib.sha256(m.tokenizer.backend.to_str().encode()).hexdigest());"
              "print(hashlib.sha256(b''.join(t.numpy().tobytes() for t in m.weights.values())).hexdigest())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    assert out[0] == hashlib.sha256(tiny_model.tokenizer.backend.to_str().encode()).hexdigest()
    assert out[1] == hashlib.sha256(b"".join(t.numpy().tobytes() for t in tiny_model.weights.values())).hexdigest()
