"""Load a Llama-architecture model (config, HF-named weights, tokenizer) for the engines.

Contract:
- `load_model(spec, *, dtype, model_dir) -> LoadedModel`. `spec` is the packaged default
  "SmolLM2-135M-Instruct", "tiny" (random weights, seed 0), a local Hugging Face Llama folder, or a
  .gguf file. The packaged GGUF is converted once into `model_dir` (default $PDBUS_MODEL_DIR or
  <repo>/.models) as a Hugging Face folder and loaded from there afterwards.
- `build_tiny_model(seed, ...)`: random weights of the same architecture with a small tokenizer.
- Every failure to find, read or understand a model raises `ModelLoadError` whose message says
  what is wrong and what to do; nothing else escapes `load_model`.
- `LoadedModel.weights` use Hugging Face Llama names and torch Linear orientation
  [out_features, in_features]; q/k projections are in HF's rotate-half RoPE layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nodes.engines.model_config import LlamaConfig
from nodes.engines.tokenizer import Tokenizer

TINY_SPEC = "tiny"


class ModelLoadError(Exception):
    """The model is missing, unreadable, corrupt or of an unsupported architecture."""


@dataclass
class LoadedModel:
    name: str  # e.g. "SmolLM2-135M-Instruct" or "tiny"
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    source: str  # where it came from: a path, "packaged" or "random"

    @property
    def num_params(self) -> int:
        return sum(t.numel() for t in self.weights.values())

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.weights.values())).dtype


def build_tiny_model(seed: int = 0, *, dtype: torch.dtype = torch.float32, num_layers: int = 2,
                     hidden_size: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
                     intermediate_size: int = 128, vocab_size: int = 512,
                     max_position_embeddings: int = 2048) -> LoadedModel:
    """Random Llama weights (deterministic per seed) with a small working byte-level tokenizer."""
    from nodes.engines import tiny

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tiny.BOS_TOKEN_ID, eos_token_ids=(tiny.EOS_TOKEN_ID,))
    return LoadedModel(name=TINY_SPEC, config=config, weights=tiny.random_llama_weights(config, seed, dtype),
                       tokenizer=tiny.tiny_tokenizer(vocab_size), source="random")


def load_model(spec: str = "SmolLM2-135M-Instruct", *, dtype: torch.dtype = torch.float32,
               model_dir=None) -> LoadedModel:
    if spec == TINY_SPEC:
        return build_tiny_model(dtype=dtype)
    raise ModelLoadError(f"loading {spec!r} is not implemented yet")
