"""Read a llama.cpp GGUF file into a Llama config, Hugging Face weights and a tokenizer.

Contract: `read_gguf(path, dtype) -> GgufModel`; raises `GgufError` (a ValueError) with a plain
message when the file is not a readable GGUF, is truncated, holds something other than a Llama
model with a GPT-2 style (byte-level BPE) tokenizer, or lacks a tensor. Weights come out in HF Llama
names and orientation: tensors are dequantized with `gguf.quants` and the q/k projections are
permuted back from llama.cpp's interleaved RoPE layout to HF's rotate-half layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, quants
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from nodes.engines.model_config import LlamaConfig
from nodes.engines.tokenizer import Tokenizer

TOKEN_TYPE_CONTROL = 3  # llama.cpp's token types: 1 normal, 3 control (special), 4 user-defined
TOKEN_TYPE_USER_DEFINED = 4

# GGUF tensor name (per layer after "blk.{i}.") -> Hugging Face Llama name (after "model.layers.{i}.").
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GgufError(ValueError):
    """The file is not a GGUF this loader can turn into a Llama model."""


@dataclass
class GgufModel:
    config: LlamaConfig
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    name: str  # general.name from the metadata, or ""


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> GgufModel:
    reader = _open(Path(path))
    meta = _Metadata(reader)
    architecture = meta.get("general.architecture")
    if architecture != "llama":
        raise GgufError(f"architecture {architecture!r} is not supported; pdbus runs Llama-architecture models")
    tokenizer = gguf_tokenizer(meta)
    config = _config(meta, tokenizer)
    weights = _weights(reader, config, dtype)
    # A file without output.weight ties the LM head to the embeddings.
    config = replace(config, tie_word_embeddings="lm_head.weight" not in weights)
    return GgufModel(config=config, weights=weights, tokenizer=tokenizer, name=meta.get("general.name") or "")


def _open(path: Path) -> GGUFReader:
    try:
        return GGUFReader(str(path), "r")
    except (ValueError, OSError, IndexError, KeyError, EOFError, TypeError) as exc:
        # GGUFReader reports bad magic, truncation and garbage as assorted low-level errors.
        raise GgufError(f"{path} is not a readable GGUF file: it is truncated or corrupt "
                        f"({type(exc).__name__}: {exc}); download or reinstall it") from exc


class _Metadata:
    """Typed access to GGUF key/value fields."""

    def __init__(self, reader: GGUFReader) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GgufError(f"GGUF metadata lacks {key!r}")
        return value


def _config(meta: _Metadata, tokenizer: Tokenizer) -> LlamaConfig:
    hidden = int(meta.require("llama.embedding_length"))
    num_heads = int(meta.require("llama.attention.head_count"))
    head_dim = int(meta.get("llama.attention.key_length") or meta.get("llama.rope.dimension_count")
                   or hidden // num_heads)
    return LlamaConfig(
        vocab_size=int(meta.get("llama.vocab_size") or tokenizer.vocab_size),
        hidden_size=hidden,
        intermediate_size=int(meta.require("llama.feed_forward_length")),
        num_layers=int(meta.require("llama.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv") or num_heads),
        head_dim=head_dim,
        rms_norm_eps=_shortest_float(meta.require("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        max_position_embeddings=int(meta.require("llama.context_length")),
        tie_word_embeddings=False,  # settled in read_gguf once the tensors are known
        bos_token_id=tokenizer.bos_token_id,
        eos_token_ids=tokenizer.eos_token_ids,
        rope_scaling=None,
    )


def _shortest_float(value: float) -> float:
    # GGUF stores float32: 1e-5 reads back as 9.99999975e-06; keep the value the model was made with.
    return float(str(np.float32(value)))


def _weights(reader: GGUFReader, config: LlamaConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    tensors = {t.name: t for t in reader.tensors}
    names = {f"{g}.weight": f"{hf}.weight" for g, hf in GLOBAL_TENSORS.items()}
    for i in range(config.num_layers):
        names |= {f"blk.{i}.{g}.weight": f"model.layers.{i}.{hf}.weight" for g, hf in LAYER_TENSORS.items()}
    missing = [g for g in names if g not in tensors and g != "output.weight"]
    if missing:
        raise GgufError(f"GGUF lacks tensors {missing[:3]}{'...' if len(missing) > 3 else ''}")
    weights = {hf: _dequantize(tensors[g], dtype) for g, hf in names.items() if g in tensors}
    for i in range(config.num_layers):
        for proj, heads in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads)):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            weights[key] = unpermute_rope_rows(weights[key], heads)
    return weights


def _dequantize(tensor: Any, dtype: torch.dtype) -> torch.Tensor:
    try:
        array = quants.dequantize(tensor.data, tensor.tensor_type)
    except (NotImplementedError, ValueError) as exc:
        raise GgufError(f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}): {exc}") from exc
    # GGUF lists dims innermost first; numpy's (rows, cols) order is already torch's [out, in].
    shape = tuple(int(d) for d in reversed(tensor.shape))
    array = np.asarray(array, dtype=np.float32).reshape(shape)
    if not array.flags.writeable:  # F32 tensors come back as views of the read-only file map
        array = array.copy()
    return torch.from_numpy(array).to(dtype)


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's conversion permute of a q/k projection.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3)...; HF rotates the first half of a head
    against the second. Its converter therefore reorders each head's rows from [first half; second
    half] to interleaved [h0, s0, h1, s1, ...]; we reverse that.
    """
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def permute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's permute (HF layout -> GGUF layout); the inverse of `unpermute_rope_rows`."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tokenizer(meta: _Metadata) -> Tokenizer:
    """A byte-level BPE tokenizer from tokenizer.ggml.* metadata (llama.cpp's "gpt2" model)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GgufError(f"tokenizer model {kind!r} is not supported; pdbus reads byte-level BPE ('gpt2') vocabularies")
    tokens = [_byte_level_spelling(t) for t in meta.require("tokenizer.ggml.tokens")]
    token_types = list(meta.get("tokenizer.ggml.token_type") or [])
    merges = [tuple(m.split(" ", 1)) for m in meta.require("tokenizer.ggml.merges")]
    backend = BackendTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                          fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # Control tokens must match whole (and be skippable on decode); user-defined ones match whole too.
    # A file without token types has no special tokens to add, hence strict=False.
    typed = list(zip(tokens, token_types, strict=False))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in typed if kind == TOKEN_TYPE_CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind in typed if kind == TOKEN_TYPE_USER_DEFINED])
    special_ids = {name: meta.get(f"tokenizer.ggml.{key}_token_id")
                   for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}
    bos_id, eos_id = special_ids["bos"], special_ids["eos"]
    if meta.get("tokenizer.ggml.add_bos_token") and bos_id is not None:
        # encode(add_special_tokens=True) then starts with BOS, as llama.cpp does for such vocabularies.
        bos = tokens[int(bos_id)]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, int(bos_id))])
    return Tokenizer(
        backend,
        bos_token_id=None if bos_id is None else int(bos_id),
        eos_token_ids=() if eos_id is None else (int(eos_id),),
        chat_template=meta.get("tokenizer.chat_template"),
        special_tokens={f"{name}_token": tokens[int(i)] for name, i in special_ids.items() if i is not None},
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of every byte, the alphabet byte-level vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


_SPELLING = _bytes_to_unicode()
_ALPHABET = frozenset(_SPELLING.values())


def _byte_level_spelling(token: str) -> str:
    # llama.cpp sometimes stores a token as raw text; the BPE model needs it in the byte alphabet.
    if set(token) <= _ALPHABET:
        return token
    return "".join(_SPELLING[b] for b in token.encode("utf-8"))
