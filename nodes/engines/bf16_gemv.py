"""The bf16 decode path's linear layers on the numba GEMV kernels (`bf16_kernels`), on torch tensors.

Contract: `Bf16Gemv.create(config, get)` returns None where the kernels cannot run (no numba, or
they fail to compile), else an object holding each layer's weights as bf16 bit patterns (numpy
uint16 views of plain [out, in] tensors; `get(name)` gives a weight in bf16 on the CPU). Its methods
take and return contiguous bf16 torch tensors of `rows` tokens:
`qkv(layer, x)` = RMSNorm + fused q/k/v projection, `decode_attention(...)` = RoPE + KV write +
attention of pure decode steps (after `set_rope(cos, sin)`), `attn_out(layer, attn, residual)` = residual +
o-projection, `mlp(layer, x)` = x + SwiGLU(RMSNorm(x)), `logits(x)` = final RMSNorm + LM head.
`LlamaRunner` takes this path for steps of at most `MAX_ROWS` tokens (decode steps), where it runs
2-3x faster than oneDNN's packed GEMMs; larger steps keep oneDNN's AMX kernels. The weights are a
second copy beside oneDNN's packed (blocked-layout) ones: 2x the weight memory, 538 MB for SmolLM2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nodes.engines import bf16_kernels as kernels
from nodes.engines.model_config import LlamaConfig

MAX_ROWS = 4   # above this oneDNN's AMX GEMMs win (harness.bench.engine, decode at batch 8)


def bits(tensor: torch.Tensor) -> np.ndarray:
    """A uint16 numpy view of a contiguous bf16 CPU tensor (no copy)."""
    return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)


@dataclass(slots=True)
class _Layer:
    input_norm: np.ndarray
    qkv: np.ndarray
    o: np.ndarray
    post_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


class Bf16Gemv:
    def __init__(self, config: LlamaConfig, get) -> None:
        self.eps = float(config.rms_norm_eps)
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}"
            self.layers.append(_Layer(
                input_norm=bits(get(f"{p}.input_layernorm.weight")),
                qkv=bits(torch.cat([get(f"{p}.self_attn.{x}_proj.weight") for x in "qkv"])),
                o=bits(get(f"{p}.self_attn.o_proj.weight")),
                post_norm=bits(get(f"{p}.post_attention_layernorm.weight")),
                gate=bits(get(f"{p}.mlp.gate_proj.weight")), up=bits(get(f"{p}.mlp.up_proj.weight")),
                down=bits(get(f"{p}.mlp.down_proj.weight"))))
        self.norm = bits(get("model.norm.weight"))
        self.head = bits(get("model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"))

    @classmethod
    def create(cls, config: LlamaConfig, get) -> Bf16Gemv | None:
        if not kernels.AVAILABLE:
            return None
        try:
            kernels.warmup()
        except Exception:   # a failing compiler leaves the oneDNN path, which serves every step
            return None
        return cls(config, get)

    @staticmethod
    def _new(rows: int, width: int) -> tuple[torch.Tensor, np.ndarray]:
        out = torch.empty(rows, width, dtype=torch.bfloat16)
        return out, bits(out)

    def qkv(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        w = self.layers[layer]
        out, out_bits = self._new(x.shape[0], w.qkv.shape[0])
        kernels.norm_linear(bits(x), w.input_norm, self.eps, w.qkv, out_bits)
        return out

    def set_rope(self, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        """The runner's bf16 RoPE tables [max_len, head_dim] (rotate-half's sign folded into sin)."""
        self.cos, self.sin = bits(cos), bits(signed_sin)

    def decode_attention(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                         cache: torch.Tensor, num_heads: int) -> torch.Tensor:
        """RoPE, KV write and attention for one decode token per row of `qkv` (see the kernel)."""
        assert cache.is_contiguous(), "the kernel writes KV into the cache in place"
        out, out_bits = self._new(qkv.shape[0], num_heads * cache.shape[5])
        kernels.decode_attention(bits(qkv), self.cos, self.sin, positions.numpy(), slots.numpy(), bits(cache),
                                 layer, num_heads, out_bits)
        return out

    def attn_out(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        w = self.layers[layer]
        out, out_bits = self._new(residual.shape[0], w.o.shape[0])
        kernels.linear_add(bits(attn), w.o, bits(residual), out_bits)
        return out

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        w = self.layers[layer]
        x_bits = bits(x)
        gated, gated_bits = self._new(x.shape[0], w.gate.shape[0])
        kernels.norm_swiglu(x_bits, w.post_norm, self.eps, w.gate, w.up, gated_bits)
        out, out_bits = self._new(x.shape[0], w.down.shape[0])
        kernels.linear_add(gated_bits, w.down, x_bits, out_bits)
        return out

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out, out_bits = self._new(x.shape[0], self.head.shape[0])
        kernels.norm_linear(bits(x), self.norm, self.eps, self.head, out_bits)
        return out
