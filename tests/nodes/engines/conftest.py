"""Shared engine fixtures: the tiny random model, the real SmolLM2 model, tiny GGUF files.

`tiny_model` is rebuilt per test (milliseconds). `smollm2` is session-scoped and loads the real model
through the loader's cache in the default model dir ($PDBUS_MODEL_DIR or <repo>/.models), so the
one-time GGUF conversion (~7 s) happens once per machine and the cached load (~0.1-1 s) once per
session. Tests that use `smollm2` should carry `@pytest.mark.real_model`.
`write_tiny_gguf(path, ...)` writes the tiny model as a llama.cpp GGUF (F32, q/k permuted the way
llama.cpp's converter does), so the GGUF path and its failures are tested in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter

from nodes.engines.gguf_reader import GLOBAL_TENSORS, LAYER_TENSORS, permute_rope_rows
from nodes.engines.model_loader import LoadedModel, build_tiny_model, load_model


@pytest.fixture
def tiny_model() -> LoadedModel:
    return build_tiny_model(seed=0, dtype=torch.float32)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("SmolLM2-135M-Instruct", dtype=torch.float32)


def _gguf_tensor_names(num_layers: int) -> dict[str, str]:
    """HF name -> GGUF name."""
    names = {f"{hf}.weight": f"{g}.weight" for g, hf in GLOBAL_TENSORS.items()}
    for i in range(num_layers):
        names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for g, hf in LAYER_TENSORS.items()}
    return names


def write_tiny_gguf(path: Path, model: LoadedModel, *, architecture: str = "llama",
                    tokenizer_model: str = "gpt2", drop_tensor: str | None = None,
                    add_bos_token: bool = False) -> Path:
    cfg, tok = model.config, model.tokenizer
    vocab = json.loads(tok.backend.to_str())["model"]
    tokens = [t for t, _ in sorted(vocab["vocab"].items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in vocab["merges"]]
    specials = {t.content for t in tok.backend.get_added_tokens_decoder().values() if t.special}
    writer = GGUFWriter(str(path), architecture)
    writer.add_name("tiny-test")
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_ids[0])
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(tok.chat_template_source)
    for hf_name, gguf_name in _gguf_tensor_names(cfg.num_layers).items():
        if hf_name not in model.weights or gguf_name == drop_tensor:
            continue
        weight = model.weights[hf_name].float()
        if hf_name.endswith("q_proj.weight"):
            weight = permute_rope_rows(weight, cfg.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            weight = permute_rope_rows(weight, cfg.num_kv_heads)
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny_gguf(tmp_path, tiny_model) -> Path:
    return write_tiny_gguf(tmp_path / "tiny-test.gguf", tiny_model)
