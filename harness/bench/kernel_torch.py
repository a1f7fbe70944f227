"""The torch side of kernel_bench: what LlamaRunner runs where a kernel does not, as modules for torch.compile.

Contract: each module here is one operation of the runner's torch path (nodes/engines/llama.py),
built from the same functions (`rms_norm`, `apply_rope`, F.linear, F.scaled_dot_product_attention)
for SmolLM2-135M's shapes (`SMOLLM2`); weights and RoPE tables are frozen parameters (`Params`), so
inductor's freezing folds them into the graph and packs the weights for oneDNN, as the runner packs
its bf16 weights. `compiled(module, linear)` compiles one as kernel_bench's contract says, under
`inductor_settings()` (freezing). The int8 codec's torch
side is TorchQuantizer's own (kernel_cases).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from nodes.engines.llama_ops import apply_rope, rms_norm
from nodes.engines.model_config import LlamaConfig, weight_shapes
from nodes.engines.rope import rope_tables

# SmolLM2-135M's config.json, hard-coded: model_config has no helper for it, and the benchmark must
# not need the downloaded model.
SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                      max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,))
H, KV, D, HIDDEN = SMOLLM2.num_heads, SMOLLM2.num_kv_heads, SMOLLM2.head_dim, SMOLLM2.hidden_size
Q_SIZE, KV_SIZE, EPS = H * D, KV * D, SMOLLM2.rms_norm_eps


@contextlib.contextmanager
def inductor_settings() -> Iterator[None]:
    """Inductor as the benchmark compiles, restored on exit: freezing on (weights become constants
    that oneDNN packs, as the runner packs its own) and the autotuner quiet (it prints every choice's
    timing to stderr; the table says what matters). Compiles happen at first calls: make them inside."""
    import torch._inductor.select_algorithm as select_algorithm
    printing, select_algorithm.PRINT_AUTOTUNE = select_algorithm.PRINT_AUTOTUNE, False
    try:
        with torch._inductor.config.patch(freezing=True, max_autotune_report_choices_stats=False), \
                warnings.catch_warnings():
            # Harmless notes from inside inductor (its own deprecated call; TorchQuantizer's mixed kernels).
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            warnings.filterwarnings("ignore", message="bf16 and fp16 are mixed")
            yield
    finally:
        select_algorithm.PRINT_AUTOTUNE = printing


def compiled(module: nn.Module, linear: bool = False) -> Callable[..., Any]:
    """torch.compile, static shapes: max-autotune for linear layers (inductor may pick its own GEMM
    templates over oneDNN's), the default mode elsewhere. Returns what the module's forward does
    (torch types every nn.Module call as Any)."""
    return torch.compile(module.eval(), mode="max-autotune-no-cudagraphs" if linear else None, dynamic=False)


def randn(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def random_weights(config: LlamaConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Random weights of the model's shapes: matrices ~N(0, 0.02) as Llamas are initialised, norms near 1."""
    g = torch.Generator().manual_seed(1)
    return {name: (torch.randn(shape, generator=g) * 0.02 if len(shape) == 2
                   else 1 + 0.1 * torch.randn(shape, generator=g)).to(dtype)
            for name, shape in weight_shapes(config).items()}


def layer_weights(w: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Layer i's weights as LlamaRunner holds them: q, k and v fused."""
    p = f"model.layers.{i}"
    return {"input_norm": w[f"{p}.input_layernorm.weight"], "o": w[f"{p}.self_attn.o_proj.weight"],
            "qkv": torch.cat([w[f"{p}.self_attn.{x}_proj.weight"] for x in "qkv"]),
            "post_norm": w[f"{p}.post_attention_layernorm.weight"], "gate": w[f"{p}.mlp.gate_proj.weight"],
            "up": w[f"{p}.mlp.up_proj.weight"], "down": w[f"{p}.mlp.down_proj.weight"]}


class Params(nn.Module):
    """Tensors as frozen parameters, which freezing folds into the compiled graph."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        super().__init__()
        for name, tensor in tensors.items():
            self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))

    if TYPE_CHECKING:   # its attributes are the tensors it was given (nn.Module says Tensor | Module)
        def __getattr__(self, name: str) -> torch.Tensor: ...


def _params(layers: nn.ModuleList) -> Iterable[Params]:
    """The layers' Params: torch types a ModuleList's items as Module only."""
    return cast("Iterable[Params]", layers)


class LayerLinears(nn.Module):
    """The linear work of decoder layers as LlamaRunner's bf16 torch path does it: RMSNorm + fused
    q/k/v, residual + o, residual + down(silu(gate(h)) * up(h)) with h = RMSNorm. Every layer's qkv
    is returned, or the compiler would drop all but the last."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Params(**layer) for layer in layers)

    def forward(self, x: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, ...]:
        qkvs = []
        for w in _params(self.layers):
            qkvs.append(F.linear(rms_norm(x, w.input_norm, EPS), w.qkv))
            x = x + F.linear(attn, w.o)
            h = rms_norm(x, w.post_norm, EPS)
            x = x + F.linear(F.silu(F.linear(h, w.gate)) * F.linear(h, w.up), w.down)
        return (x, *qkvs)


class Head(Params):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.head)


class NormHead(Params):
    """The runner's logits: final RMSNorm, then the LM head."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(x, self.norm, EPS), self.head)


class Linears(nn.Module):
    """float32: the four F.linear calls of each layer that dot_f32.SmallLinear takes over."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Params(qkv=w["qkv"], o=w["o"], gate_up=torch.cat([w["gate"], w["up"]]),
                                           down=w["down"]) for w in layers)

    def forward(self, x: torch.Tensor, attn: torch.Tensor, gated: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(y for w in _params(self.layers) for y in (F.linear(x, w.qkv), F.linear(attn, w.o),
                                                      F.linear(x, w.gate_up), F.linear(gated, w.down)))


def runner_rope_tables(length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaRunner's RoPE tables: rotate-half's sign folded into sin."""
    cos, sin = rope_tables(SMOLLM2, length)
    return cos.to(dtype), torch.cat([-sin[:, :D // 2], sin[:, D // 2:]], dim=-1).to(dtype)


def _attend_slots(q, k, v, positions, slots, cache: torch.Tensor, grouped: bool) -> torch.Tensor:
    """LlamaRunner._decode_attention for a dense group, every slot at one length (no mask): k and v
    written into one layer's slot cache [slots, 2, kv_heads, keys, head_dim], then batched SDPA.
    float32 groups the query heads of a KV head as its query rows, bf16 uses SDPA's GQA (as there)."""
    k_cache, v_cache = cache[:, 0], cache[:, 1]
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v
    heads, rows = (KV, H // KV) if grouped else (H, 1)
    attn = F.scaled_dot_product_attention(q.reshape(-1, heads, rows, D), k_cache, v_cache, enable_gqa=heads != KV)
    return attn.reshape(-1, Q_SIZE)


class DecodeAttentionBf16(Params):
    """One layer: RoPE on q and k (apply_rope), then `_attend_slots`. Compiled a layer at a time, as
    the runner calls it: one graph of all layers, writing into views of one cache input, compiles
    into copies of the whole cache (16 layers of the benchmark's: 620 ms, against ~80 compiled a
    layer at a time and 73 eager; ad-hoc timing on a Zen 4 core)."""

    def forward(self, qkv, positions, slots, cache) -> torch.Tensor:
        qk = apply_rope(qkv[:, :Q_SIZE + KV_SIZE].view(qkv.shape[0], H + KV, D),
                        self.cos[positions][:, None, :], self.sin[positions][:, None, :])
        v = qkv[:, Q_SIZE + KV_SIZE:].view(qkv.shape[0], KV, D)
        return _attend_slots(qk[:, :H], qk[:, H:], v, positions, slots, cache, grouped=False)


class DecodeAttentionF32(nn.Module):
    """One layer of the float32 path: q, k and v come with RoPE applied (the kernel starts there too)."""

    def forward(self, q, k, v, positions, slots, cache) -> torch.Tensor:
        return _attend_slots(q, k, v, positions, slots, cache, grouped=True)


class PrefillAttention(nn.Module):
    """LlamaRunner._span_sdpa of a whole prompt: causal SDPA, 4-D, SDPA's GQA."""

    def forward(self, q: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        attn = F.scaled_dot_product_attention(q[None], cache[None, 0], cache[None, 1], is_causal=True, enable_gqa=True)
        return attn[0].transpose(0, 1).reshape(q.shape[1], Q_SIZE)


class RmsNorm(Params):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, EPS)


class RopeAndCache(Params):
    """LlamaRunner's prefill span: RoPE on q and k (apply_rope), k and v into the span's cache layer
    (_span_attention), q in the [heads, tokens, head_dim] layout SDPA reads."""

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        tokens = qkv.shape[0]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        qk = apply_rope(qkv[:, :Q_SIZE + KV_SIZE].view(tokens, H + KV, D), cos, sin)
        cache[0, :, :tokens] = qk[:, H:].transpose(0, 1)
        cache[1, :, :tokens] = qkv[:, Q_SIZE + KV_SIZE:].view(tokens, KV, D).transpose(0, 1)
        return qk[:, :H].transpose(0, 1).contiguous()
