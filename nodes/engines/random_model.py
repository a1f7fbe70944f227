"""Random-weight models of real models' shapes, built in memory: no weights come from a hub.

Contract:
- `SHAPES` maps a shape name to its Llama dimensions; `random-llama-8b` is Llama 3 8B's (32
  layers, hidden 4096, 32 query heads, 8 KV heads of 128, MLP 14336, vocabulary 128256): 8.0 B
  parameters, 128 KiB of bf16 KV a token, so a 4,096-token prompt holds 512 MiB.
- `is_random_spec(spec)`: whether `spec` names one, as `NAME` or `NAME:LAYERS` (the same
  dimensions with fewer layers: a CPU test of the very kernels and KV rows at a size it can hold).
- `build_random_model(spec, *, dtype, device, seed)`: a LoadedModel named `spec` whose `source` is
  "random-weight", so that every output naming the model says what it is. Weights are drawn as the
  tiny model's are (normal, std 0.02; norms one) straight on `device` in `dtype`: 8 B values drawn
  on a CPU take about a minute, on a GPU milliseconds. The same seed gives the same weights on the
  same kind of device. The tokenizer is the tiny model's byte-level one; ids it lacks decode to "".
- `random_max_len(spec)`: the context length, for the gateway (no torch).

Why: pdbus's KV path is sized by the model's layers, heads and prompt length, not its weights, and
no machine here may download an 8B model. Its tokens mean nothing; its KV sizes, transfer volumes
and kernels are an 8B model's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from nodes.engines.hf_folder import ModelLoadError
from nodes.engines.model_config import LlamaConfig, weight_shapes

if TYPE_CHECKING:
    import torch

    from nodes.engines.model_loader import LoadedModel
    from nodes.engines.tokenizer import Tokenizer

RANDOM_SOURCE = "random-weight"
SHAPES: dict[str, dict] = {
    "random-llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                            num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                            max_position_embeddings=32768, tie_word_embeddings=False),
}
MAX_LAYERS = 256
TOKENIZER_VOCAB = 1024   # what the tiny tokenizer is trained to (its corpus gives ~600 tokens)


def _parse(spec: str) -> tuple[str, int | None]:
    name, _, layers = spec.partition(":")
    if name not in SHAPES:
        raise ModelLoadError(f"unknown random shape {name!r}: one of {', '.join(SHAPES)}")
    if not layers:
        return name, None
    if not layers.isdigit() or not 1 <= int(layers) <= MAX_LAYERS:
        raise ModelLoadError(f"{spec!r}: the layer count after ':' must be a whole number 1..{MAX_LAYERS}")
    return name, int(layers)


def is_random_spec(spec: str) -> bool:
    return spec.partition(":")[0] in SHAPES


def random_config(spec: str) -> LlamaConfig:
    from nodes.engines import tiny

    name, layers = _parse(spec)
    values = SHAPES[name] | ({"num_layers": layers} if layers else {})
    return LlamaConfig(**values, bos_token_id=tiny.BOS_TOKEN_ID, eos_token_ids=(tiny.EOS_TOKEN_ID,))


def random_max_len(spec: str) -> int:
    return random_config(spec).max_position_embeddings


def num_parameters(config: LlamaConfig) -> int:
    return sum(math.prod(shape) for shape in weight_shapes(config).values())


def build_random_model(spec: str, *, dtype: torch.dtype | None = None, device: str = "cpu",
                       seed: int = 0) -> LoadedModel:
    import torch

    from nodes.engines import tiny
    from nodes.engines.model_loader import LoadedModel

    config = random_config(spec)
    dtype = dtype or torch.bfloat16
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            weights[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            weights[name] = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, tiny.INIT_STD,
                                                                                  generator=generator)
    return LoadedModel(name=spec, config=config, weights=weights, tokenizer=random_tokenizer(), source=RANDOM_SOURCE)


def random_tokenizer() -> Tokenizer:
    from nodes.engines import tiny

    return tiny.tiny_tokenizer(TOKENIZER_VOCAB)
