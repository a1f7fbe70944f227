"""`pdbus model prepare|info`: convert the model into the local cache, or describe it.

Contract: `add_arguments(parser)` and `main(args) -> int`. `prepare` converts a GGUF (the packaged
SmolLM2 by default) once into the model directory and prints one summary line; `info` loads the model
and prints its shape, size and tokenizer facts, and with `--time` also times a fresh conversion into a
scratch directory and a cached load. The model defaults to `[engine] model` / `dtype` / `model_dir`
from the config file. Any `ModelLoadError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from nodes.config_file import load_settings, section
from nodes.engines.engine_common import DTYPES, resolve_dtype
from nodes.engines.model_loader import (
    DEFAULT_MODEL,
    LoadedModel,
    ModelLoadError,
    default_model_dir,
    load_model,
    prepare_model,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["prepare", "info"], help="prepare: convert and cache; info: describe")
    parser.add_argument("--model", help=f"model spec: {DEFAULT_MODEL!r} (packaged), 'tiny', an HF folder or a .gguf")
    parser.add_argument("--model-dir", help="cache directory (default: $PDBUS_MODEL_DIR or <repo>/.models)")
    parser.add_argument("--dtype", choices=["auto", *sorted(DTYPES)],
                        help="weight dtype to load (default: [engine] dtype)")
    parser.add_argument("--force", action="store_true", help="prepare: convert again even if cached")
    parser.add_argument("--time", action="store_true", help="info: time a fresh conversion and a cached load")


def main(args: argparse.Namespace) -> int:
    engine = section(load_settings(getattr(args, "config", None)), "engine")
    spec = args.model or engine.get("model") or DEFAULT_MODEL
    model_dir = args.model_dir or engine.get("model_dir") or default_model_dir()
    dtype = resolve_dtype(args.dtype or engine.get("dtype") or "float32", engine.get("device", "cpu"))
    try:
        if args.action == "prepare":
            return _prepare(spec, model_dir, dtype, force=args.force)
        return _info(spec, model_dir, dtype, timed=args.time)
    except ModelLoadError as exc:
        print(f"pdbus model: error: {exc}", file=sys.stderr)
        return 2


def _prepare(spec: str, model_dir, dtype: torch.dtype, *, force: bool) -> int:
    started = time.perf_counter()
    folder = prepare_model(spec, model_dir=model_dir, force=force) if spec != "tiny" else None
    model = load_model(spec, dtype=dtype, model_dir=model_dir)  # proves the cache loads
    seconds = time.perf_counter() - started
    print(f"prepared {model.name}: {model.num_params / 1e6:.1f}M params, {_dtype_name(model.dtype)}, "
          f"{folder or model.source} ({seconds:.1f} s)")
    return 0


def _info(spec: str, model_dir, dtype: torch.dtype, *, timed: bool) -> int:
    started = time.perf_counter()
    model = load_model(spec, dtype=dtype, model_dir=model_dir)
    load_seconds = time.perf_counter() - started
    for line in describe(model):
        print(line)
    print(f"load:         {load_seconds:.2f} s")
    if timed and spec != "tiny":
        conversion, cached = time_conversion(spec, dtype)
        print(f"conversion:   {conversion:.1f} s (fresh, into a scratch directory)")
        print(f"cached load:  {cached:.2f} s (from that directory)")
    return 0


def describe(model: LoadedModel) -> list[str]:
    cfg, tok = model.config, model.tokenizer
    weight_bytes = sum(t.numel() * t.element_size() for t in model.weights.values())
    return [
        f"model:        {model.name} ({model.source})",
        f"params:       {model.num_params / 1e6:.1f}M, {_dtype_name(model.dtype)}, {weight_bytes / 2**20:.0f} MiB",
        f"layers:       {cfg.num_layers}, hidden {cfg.hidden_size}, ffn {cfg.intermediate_size}",
        f"attention:    {cfg.num_heads} heads, {cfg.num_kv_heads} kv heads, head_dim {cfg.head_dim}, "
        f"rope_theta {cfg.rope_theta:g}",
        f"context:      {cfg.max_position_embeddings} tokens, tied embeddings: {cfg.tie_word_embeddings}",
        f"tokenizer:    {tok.vocab_size} tokens, bos {tok.bos_token_id}, eos {list(tok.eos_token_ids)}, "
        f"chat template: {'yes' if tok.chat_template_source else 'no'}",
    ]


def time_conversion(spec: str, dtype: torch.dtype) -> tuple[float, float]:
    """(seconds to convert from scratch, seconds to load the converted folder)."""
    with tempfile.TemporaryDirectory(prefix="pdbus-model-") as scratch:
        started = time.perf_counter()
        prepare_model(spec, model_dir=scratch, force=True)
        converted = time.perf_counter()
        load_model(spec, dtype=dtype, model_dir=scratch)
        return converted - started, time.perf_counter() - converted


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
