"""A Hugging Face Llama folder on disk, read and written (for `nodes.engines.model_loader`).

Contract:
- `folder_config(folder) -> LlamaConfig`: config.json, with generation_config.json's stop ids
  when it has them; a model type outside SUPPORTED_MODEL_TYPES, or a Llama variant with biases
  or an activation other than silu, is refused.
- `folder_weights(folder, config, dtype)`: every *.safetensors file, merged, each weight the
  config names checked for presence and shape and cast to `dtype` (extra tensors left out).
- `save_folder(folder, config, weights, tokenizer)`: config.json, generation_config.json,
  model.safetensors and the tokenizer files, which transformers and vLLM load as is.
  `write_json(path, value)`: one JSON file, written as the folder's are (the loader's marker).
- Every failure to read or understand a folder raises `ModelLoadError`, its message saying what is
  wrong and what to do. It is the loader's error for any model (defined here, where both raise it).
torch is imported only where weights are read or written: the gateway reads configs without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from nodes.engines.model_config import SUPPORTED_MODEL_TYPES, LlamaConfig, weight_shapes

if TYPE_CHECKING:
    import torch

    from nodes.engines.tokenizer import Tokenizer


class ModelLoadError(Exception):
    """The model is missing, unreadable, corrupt or of an unsupported architecture."""


def folder_config(folder: Path) -> LlamaConfig:
    hf = _read_json_file(folder / "config.json", required=True)
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"{folder} holds a {model_type!r} model; pdbus runs Llama-architecture models "
                             f"(model_type {', '.join(SUPPORTED_MODEL_TYPES)})")
    if hf.get("attention_bias") or hf.get("mlp_bias") or hf.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{folder}: Llama variants with biases or activations other than silu are not supported")
    generation = _read_json_file(folder / "generation_config.json", required=False)
    if generation.get("eos_token_id") is not None:  # generation_config.json knows every stop id
        hf = {**hf, "eos_token_id": generation["eos_token_id"]}
    return LlamaConfig.from_hf_dict(hf)


def _read_json_file(path: Path, *, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelLoadError(f"{path} is missing; a Hugging Face model folder needs config.json, "
                                 "*.safetensors and tokenizer.json")
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return value


def folder_weights(folder: Path, config: LlamaConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors weights (other weight formats are not supported)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors |= load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{file} is unreadable or truncated ({exc}); rebuild a converted cache "
                                 "with `pdbus model prepare --force`, or re-download the model") from exc
    expected = weight_shapes(config)
    missing = [name for name in expected if name not in tensors]
    wrong = [f"{n} {tuple(tensors[n].shape)} != {s}" for n, s in expected.items()
             if n in tensors and tuple(tensors[n].shape) != s]
    if missing or wrong:
        raise ModelLoadError(f"{folder} does not match its config.json: missing {missing[:3]}, "
                             f"wrong shapes {wrong[:3]}")
    # Extra tensors (a tied lm_head copy, rotary inv_freq buffers) are not weights the runner uses.
    return {name: tensors[name].to(dtype) for name in expected}


def save_folder(folder: Path, config: LlamaConfig, weights: dict[str, torch.Tensor],
                tokenizer: Tokenizer) -> None:
    """Write a Hugging Face Llama folder that transformers and vLLM load as is."""
    from safetensors.torch import save_file

    dtype_name = str(next(iter(weights.values())).dtype).removeprefix("torch.")
    write_json(folder / "config.json", config.to_hf_dict(dtype_name))
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": list(config.eos_token_ids),
                  "pad_token_id": tokenizer.token_to_id(tokenizer.special_tokens.get("pad_token") or "")}
    write_json(folder / "generation_config.json", {k: v for k, v in generation.items() if v is not None})
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    tokenizer.save(folder, model_max_length=config.max_position_embeddings)


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")
