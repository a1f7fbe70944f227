"""The shape of a Llama-architecture model, independent of where its weights come from.

Contract: `LlamaConfig` is the one description of a model that the loader produces and the runner
consumes (frozen, hashable, no torch). `LlamaConfig.from_hf_dict` / `to_hf_dict` translate to and from
a Hugging Face `config.json` so a cached model folder also loads in transformers and vLLM.
`weight_shapes(config)` lists every Hugging Face Llama weight name with its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama",)


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    rope_scaling: dict | None = None  # None for SmolLM2

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any]) -> LlamaConfig:
        """Read a Hugging Face Llama `config.json` dict (raises KeyError/ValueError when incomplete)."""
        num_heads = int(hf["num_attention_heads"])
        hidden_size = int(hf["hidden_size"])
        eos = hf.get("eos_token_id")
        eos_ids = tuple(int(i) for i in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        rope_theta = hf.get("rope_theta")
        rope_scaling = hf.get("rope_scaling")
        # transformers 5 nests rope settings under `rope_parameters`.
        params = hf.get("rope_parameters") or {}
        if rope_theta is None:
            rope_theta = params.get("rope_theta", 10000.0)
        if rope_scaling is None and params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden_size,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or hidden_size // num_heads),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
            eos_token_ids=eos_ids,
            rope_scaling=rope_scaling,
        )

    def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
        """A `config.json` dict that transformers' and vLLM's LlamaForCausalLM accept."""
        eos: int | list[int] | None = list(self.eos_token_ids)
        if len(self.eos_token_ids) == 1:
            eos = self.eos_token_ids[0]
        elif not self.eos_token_ids:
            eos = None
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": torch_dtype,
        }


def weight_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face Llama weight name with its [out_features, in_features] shape."""
    q_size = config.num_heads * config.head_dim
    kv_size = config.num_kv_heads * config.head_dim
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (q_size, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_size, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_size, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, q_size),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
            f"{prefix}.mlp.up_proj.weight": (inter, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inter),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes
