"""The bf16 path on the kernels: decode attention, norms and RoPE of every step, and the linear
layers of steps whose rows the plan gives to a linear kernel.

Contract: `Bf16FastPath(config, get, plan)` takes a plan whose decode attention is the bf16 kernel
(kernels.dispatch; `get(name)` gives a weight in bf16 on the CPU). Where the plan's `linear` is a
kernel it holds every matrix a decode step streams as bf16 bit patterns (numpy uint16 views) laid
out for it: AMX tiles ("amx") or pairs for vdpbf16ps ("dot_bf16"); a model whose shapes that layout
cannot take, like a plan whose `linear` is "torch", holds none. `plan` is the plan as narrowed to
this model, and `takes_rows(n)` says whether a step of n tokens runs its linear layers here
(`n <= max_rows`). The methods take and return contiguous bf16 torch tensors; the
linear ones take steps of `takes_rows` rows only:
`qkv(layer, x)` = RMSNorm + fused q/k/v projection, `decode_attention(...)` = RoPE + KV write +
attention of pure decode steps (after `set_rope(cos, sin)`), `attn_out(layer, attn, residual)` =
residual + o-projection, `mlp(layer, x)` = x + SwiGLU(RMSNorm(x)), `logits(x)` = final RMSNorm + LM head.
For steps of any size (kernels.norm_rope): `rms_norm(layer, x, post)` = a layer's input (or post-
attention) RMSNorm as a new tensor, and `rope_and_cache(qkv, start, num_heads, cache)` = RoPE on a
prefill span's q and k, its k and v written into its layer's cache, q returned [heads, rows, dim];
`prefill_attention(q, cache, start)` where `attends`.
What `qkv`, `decode_attention` and `logits` return is a buffer reused by the next call of the same
method with as many rows (a step consumes each before the next layer asks again; copy to keep one);
`attn_out` and `mlp` add into their residual in place and return it (the residual stream is one
tensor through all layers): a step of few rows is short, and allocating its outputs and
re-viewing tensors as numpy on every call cost a measurable share of it.
The weights are a second copy beside oneDNN's packed ones (other steps run on oneDNN), on huge
pages: 2x the weight memory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from nodes.engines import hugepages
from nodes.engines.kernels import amx_tiles
from nodes.engines.kernels.decode_attention import bf16 as decode_bf16
from nodes.engines.kernels.dispatch import KernelPlan
from nodes.engines.kernels.linear import amx as linear_amx
from nodes.engines.kernels.linear import dot_bf16
from nodes.engines.kernels.norm_rope import bf16 as norm_rope_bf16
from nodes.engines.kernels.prefill_attention import tiled
from nodes.engines.model_config import LlamaConfig


def bits(tensor: torch.Tensor) -> np.ndarray:
    """A uint16 numpy view of a contiguous bf16 CPU tensor (no copy)."""
    return tensor.contiguous().view(torch.int16).numpy().view(np.uint16)


@dataclass(frozen=True, slots=True)
class _Norms:
    input_norm: np.ndarray
    post_norm: np.ndarray


@dataclass(frozen=True, slots=True)
class _Layer:
    """A layer's weights where a linear kernel serves: its norms, and its matrices in the kernel's layout."""
    input_norm: np.ndarray
    post_norm: np.ndarray
    qkv: np.ndarray
    o: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


class Bf16FastPath:
    def __init__(self, config: LlamaConfig, get, plan: KernelPlan) -> None:
        assert plan.fast_bf16, "the plan gives the bf16 steps to torch"
        self.eps = float(config.rms_norm_eps)
        self.norms = [_Norms(input_norm=bits(get(f"model.layers.{i}.input_layernorm.weight")),
                             post_norm=bits(get(f"model.layers.{i}.post_attention_layernorm.weight")))
                      for i in range(config.num_layers)]
        self.layers: list[_Layer] = []
        self.norm = bits(get("model.norm.weight"))
        matrices = _matrices(config, get) if plan.linear != "torch" else {}
        self.amx = plan.linear == "amx" and all(amx_tiles.can_pack(tuple(m.shape)) for m in matrices.values())
        self.dot = (not self.amx and plan.linear == "dot_bf16"
                    and all(dot_bf16.can_run(m.shape[1]) for m in matrices.values()))
        # A model whose shapes the plan's packed layout cannot take runs its linear layers on torch.
        linear = "amx" if self.amx else "dot_bf16" if self.dot else "torch"
        self.max_rows = plan.linear_max_rows if linear != "torch" else 0
        # Prefill attention on AMX tiles (or soft_tiles where the CPU has no AMX), for head_dim 64 (SDPA otherwise).
        self.attends = (plan.prefill_attention == "soft_tiles" or (plan.prefill_attention == "amx_tiles" and self.amx))
        self.attends = self.attends and tiled.can_attend(config.num_heads, config.num_kv_heads, config.head_dim)
        self.plan = replace(plan, linear=linear, linear_max_rows=self.max_rows,
                            prefill_attention=plan.prefill_attention if self.attends else "torch")
        self._workspace: tiled.Workspace | None = None
        self.attention_prefetch = plan.attention_prefetch
        self._buffers: dict[tuple[str, int, int], tuple[torch.Tensor, np.ndarray]] = {}
        self._scratch: dict[tuple[str, int, int], np.ndarray] = {}
        self._views: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        if linear != "torch":
            self._hold_matrices(matrices)

    def takes_rows(self, num_rows: int) -> bool:
        """Whether a step of `num_rows` tokens runs its linear layers here (else on torch)."""
        return num_rows <= self.max_rows

    def _hold_matrices(self, matrices: dict[tuple[int, str] | str, torch.Tensor]) -> None:
        """The matrices in the linear kernel's layout, in one allocation on huge pages (fewer TLB
        misses for what a decode step streams)."""
        arena = hugepages.Arena([(self._stored_elements(m),) for m in matrices.values()], torch.int16)
        weights = {key: arena.copy(self._layout(bits(m))).numpy().view(np.uint16) for key, m in matrices.items()}
        # Outputs of the matrices whose outputs a method returns (packed layouts pad them).
        self._widths = {"qkv": matrices[0, "qkv"].shape[0], "gated": matrices[0, "gate"].shape[0],
                        "logits": matrices["head"].shape[0]}
        self.layers = [_Layer(norms.input_norm, norms.post_norm,
                              *(weights[i, n] for n in ("qkv", "o", "gate", "up", "down")))
                       for i, norms in enumerate(self.norms)]
        self.head = weights["head"]

    def _layout(self, matrix: np.ndarray) -> torch.Tensor:
        """A matrix as this object stores it: AMX tiles or pairs for vdpbf16ps (int16 bits)."""
        stored = amx_tiles.pack(matrix) if self.amx else dot_bf16.pack(matrix)
        return torch.from_numpy(stored.view(np.int16))

    def _stored_elements(self, matrix: torch.Tensor) -> int:
        """Elements of `_layout(matrix)`: vdpbf16ps's blocks pad the outputs to a multiple of 64."""
        outputs, inputs = matrix.shape
        return (dot_bf16.padded_outputs(outputs) if self.dot else outputs) * inputs

    def _out(self, role: str, rows: int, width: int) -> tuple[torch.Tensor, np.ndarray]:
        key = (role, rows, width)
        buffer = self._buffers.get(key)
        if buffer is None:
            out = torch.empty(rows, width, dtype=torch.bfloat16)
            buffer = self._buffers[key] = (out, bits(out))
        return buffer

    def _pad(self, role: str, rows: int, width: int, dtype=np.float32) -> np.ndarray:
        """AMX scratch: [16 or 32 rows, width], kept per role and size."""
        padded = -(-rows // amx_tiles.TILE_ROWS) * amx_tiles.TILE_ROWS
        key = (role, padded, width)
        if key not in self._scratch:   # tiles load and store it: page-aligned, as amx_tiles asks
            self._scratch[key] = amx_tiles.aligned_zeros((padded, width), dtype)
        return self._scratch[key]

    def _norm_linear(self, x: np.ndarray, norm_w: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        if self.amx:
            linear_amx.norm_linear(x, norm_w, self.eps, w, self._pad("x", len(x), x.shape[1], np.uint16),
                                   self._pad("acc", len(x), out.shape[1]), out)
        else:
            dot_bf16.norm_linear(x, norm_w, self.eps, w, out)

    def _linear_add(self, x: np.ndarray, w: np.ndarray, residual: np.ndarray) -> None:
        if self.amx:
            linear_amx.linear_add(x, w, residual, self._pad("x", len(x), x.shape[1], np.uint16),
                                  self._pad("acc", len(x), residual.shape[1]), residual)
        else:
            dot_bf16.linear_add(x, w, residual, residual)

    def _bits(self, tensor: torch.Tensor) -> np.ndarray:
        """`bits(tensor)`, remembered for small tensors seen before (the residual, this object's
        buffers); a remembered view keeps its tensor alive, so a reused address is never stale."""
        key = (tensor.data_ptr(), tuple(tensor.shape))
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 64:   # a new residual per step: keep the cache small
                self._views.clear()
            view = self._views[key] = bits(tensor)
        return view

    def qkv(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        w = self.layers[layer]
        out, out_bits = self._out("qkv", x.shape[0], self._widths["qkv"])
        self._norm_linear(self._bits(x), w.input_norm, w.qkv, out_bits)
        return out

    def set_rope(self, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        """The runner's bf16 RoPE tables [max_len, head_dim] (rotate-half's sign folded into sin)."""
        self.cos, self.sin = bits(cos), bits(signed_sin)

    def decode_attention(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                         cache: torch.Tensor, num_heads: int) -> torch.Tensor:
        """RoPE, KV write and attention for one decode token per row of `qkv` (see the kernel)."""
        assert cache.is_contiguous(), "the kernel writes KV into the cache in place"
        out, out_bits = self._out("attn", qkv.shape[0], num_heads * cache.shape[5])
        qkv_bits = self._bits(qkv) if self.takes_rows(qkv.shape[0]) else bits(qkv)   # a oneDNN output: new each layer
        # The cache's view is not remembered: it would keep a released slot cache alive.
        decode_bf16.decode_attention(qkv_bits, self.cos, self.sin, positions.numpy(), slots.numpy(),
                                     bits(cache), layer, num_heads, out_bits, decode_bf16.PAIRS,
                                     decode_bf16.PAIR_VALUES, self.attention_prefetch)
        return out

    def rms_norm(self, layer: int, x: torch.Tensor, post: bool = False) -> torch.Tensor:
        w = self.norms[layer]
        out = torch.empty_like(x)
        norm_rope_bf16.rms_norm(bits(x), w.post_norm if post else w.input_norm, self.eps, bits(out))
        return out

    def rope_and_cache(self, qkv: torch.Tensor, start: int, num_heads: int, cache: torch.Tensor) -> torch.Tensor:
        """`cache` is one layer of a sequence's cache [2, kv_heads, capacity, head_dim], written in place."""
        q = torch.empty(num_heads, qkv.shape[0], cache.shape[-1], dtype=qkv.dtype)
        cache_bits = cache.view(torch.int16).numpy().view(np.uint16)
        norm_rope_bf16.rope_and_cache(bits(qkv), self.cos, self.sin, start, num_heads, bits(q), cache_bits)
        return q

    def prefill_attention(self, q: torch.Tensor, cache: torch.Tensor, start: int) -> torch.Tensor:
        """A prefill span's causal attention (`attends` must hold): q [heads, rows, head_dim] as
        `rope_and_cache` returns it, `cache` its layer's [2, kv_heads, capacity, head_dim] with the
        span's keys and values written; returns [rows, heads * head_dim]."""
        num_keys = start + q.shape[1]
        if self._workspace is None or self._workspace.num_keys < num_keys:
            self._workspace = tiled.Workspace(max(1024, 1 << (num_keys - 1).bit_length()))
        out = torch.empty(q.shape[1], q.shape[0] * q.shape[2], dtype=q.dtype)
        cache_bits = cache.view(torch.int16).numpy().view(np.uint16)
        tiled.prefill_attention(bits(q), cache_bits[0], cache_bits[1], start, bits(out), self._workspace)
        return out

    def attn_out(self, layer: int, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual += o(attn), in place (the kernel reads each residual value before writing it)."""
        w = self.layers[layer]
        self._linear_add(self._bits(attn), w.o, self._bits(residual))
        return residual

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x += SwiGLU(RMSNorm(x)), in place."""
        w = self.layers[layer]
        x_bits = self._bits(x)
        gated, gated_bits = self._out("gated", x.shape[0], self._widths["gated"])
        if self.amx:
            rows = x.shape[0]
            linear_amx.norm_swiglu(x_bits, w.post_norm, self.eps, w.gate, w.up,
                                   self._pad("x", rows, x.shape[1], np.uint16), self._pad("acc", rows, gated.shape[1]),
                                   self._pad("acc_up", rows, gated.shape[1]), gated_bits)
        else:
            dot_bf16.norm_swiglu(x_bits, w.post_norm, self.eps, w.gate, w.up, gated_bits)
        self._linear_add(gated_bits, w.down, x_bits)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out, out_bits = self._out("logits", x.shape[0], self._widths["logits"])
        self._norm_linear(self._bits(x), self.norm, self.head, out_bits)
        return out


def _matrices(config: LlamaConfig, get) -> dict[tuple[int, str] | str, torch.Tensor]:
    """Every matrix a decode step streams: (layer, name) for q/k/v fused, o, gate, up, down; "head"."""
    matrices: dict[tuple[int, str] | str, torch.Tensor] = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        matrices[i, "qkv"] = torch.cat([get(f"{p}.self_attn.{x}_proj.weight") for x in "qkv"])
        for name, key in (("o", "self_attn.o_proj"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"),
                          ("down", "mlp.down_proj")):
            matrices[i, name] = get(f"{p}.{key}.weight")
    matrices["head"] = get("model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight")
    return matrices
