"""The built-in Llama runner: one forward pass over a packed batch of prefill chunks and decode tokens.

Contract: `LlamaRunner(model, dtype=, device=)` prepares the weights (q/k/v and gate/up fused so a
layer is four matmuls) and `forward(batch) -> logits [num_sampled, vocab] float32`, computing
logits only for the rows in `batch.sample_rows` (a prompt's last token, each decode token).

All tokens of the step are packed into one [tokens, hidden] matrix, so the linear layers run once
for the whole batch whatever mix of prompts and decode steps it holds. Attention reads and writes
KV caches laid out [layers, 2 (K, V), kv_heads, capacity, head_dim] (the batch's types are in
forward_batch.py, RMSNorm and RoPE in llama_ops.py):
- `PrefillSpan`: a run of a sequence's tokens against its own cache view (causal within the span,
  full over the `start` tokens already cached), one SDPA call per span;
- `DecodeGroup`: one new token for each of several decode slots of a `[layers, slots, 2, kv_heads,
  capacity, head_dim]` slot cache, attended in ONE batched SDPA call over the slots with a length
  mask (no gathering of KV: the slots are views of one tensor); on a CUDA device pure decode steps
  replay a CUDA graph of the whole step (cuda_graphs.py; `forward_eager` is the step without one).
On the CPU, kernels.dispatch decides which compiled kernels take which operations (`kernels`, the
runner's KernelPlan; docs/KERNELS.md): in bf16 the fast path (kernels.fast_path) takes decode steps
whole, and RMSNorm, RoPE with the KV writes and prefill attention of larger steps; in float32 the
decode attention kernel and AVX-512 linear layers take decode steps. bf16 kernels round where torch
rounds; float32 kernels sum in another order than MKL, so such steps match transformers to float32
rounding rather than bit for bit.
Math follows Hugging Face's LlamaForCausalLM (RMSNorm in float32, rotate-half RoPE, SwiGLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from nodes.engines.cuda_graphs import DecodeGraphs
from nodes.engines.forward_batch import DecodeGroup, ForwardBatch, PrefillSpan
from nodes.engines.kernels import dispatch
from nodes.engines.kernels.decode_attention import f32 as f32_attention
from nodes.engines.kernels.fast_path import Bf16FastPath
from nodes.engines.kernels.linear import dot_f32
from nodes.engines.llama_ops import apply_rope, can_pack_weights, packed_linear, rms_norm
from nodes.engines.model_config import LlamaConfig
from nodes.engines.rope import rope_tables


@dataclass(slots=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor | None     # plain weights: gate and up in one matmul
    down: torch.Tensor
    gate: torch.Tensor | None = None  # packed weights: separate, for oneDNN's fused epilogues
    up: torch.Tensor | None = None


class LlamaRunner:
    def __init__(self, config: LlamaConfig, weights: dict[str, torch.Tensor], *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 max_len: int | None = None, pack_weights: bool | None = None,
                 use_kernels: bool = True, cuda_graphs: bool = True) -> None:
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.packed = can_pack_weights(dtype, self.device) if pack_weights is None else pack_weights
        self._linear = packed_linear if self.packed else F.linear

        def get(name: str) -> torch.Tensor:
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        def get_matrix(*names: str) -> torch.Tensor:
            matrix = torch.cat([get(n) for n in names]) if len(names) > 1 else get(names[0])
            return torch.ops.mkldnn._reorder_linear_weight(matrix, None) if self.packed else matrix

        self.layers = [self._layer(get, get_matrix, f"model.layers.{i}", self.packed) for i in range(config.num_layers)]
        self.embed = get("model.embed_tokens.weight")
        self.lm_head = get_matrix("model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight")
        self.norm = get("model.norm.weight")
        # Which kernel serves each operation is kernels.dispatch's decision alone (docs/KERNELS.md).
        plan = dispatch.plan(str(dtype).removeprefix("torch."), self.device.type, use_kernels=use_kernels)
        if not self.packed and plan.fast_bf16:   # the bf16 kernels pair with oneDNN's packed weights
            plan = dispatch.TORCH
        # bf16: decode attention, norms and RoPE on the kernels, and the linear layers of the steps
        # whose rows the plan gives to a linear kernel (oneDNN's GEMMs take the others).
        self.fast_path = Bf16FastPath(config, get, plan) if plan.fast_bf16 else None
        # RMSNorm, RoPE and the KV writes of prompts on the kernels (the norm_rope tests turn it off to
        # compare them alone with torch's ops, the attention kernel kept).
        self.fused = self.fast_path is not None
        if plan.linear == "dot_f32":   # float32 decode steps' linear layers on AVX-512 outer products
            mats = [w for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down) if w is not None]
            self._linear = dot_f32.SmallLinear([self.lm_head, *mats])
        # float32 pure decode steps: the KV write and attention in one kernel instead of SDPA.
        self.f32_attends = plan.decode_attention == "f32"
        self.f32_prefetch = self.f32_attends and plan.attention_prefetch
        self.kernels = self.fast_path.plan if self.fast_path is not None else plan
        self.max_len = max_len or config.max_position_embeddings
        cos, sin = rope_tables(config, self.max_len)
        half = config.head_dim // 2
        # The sign of rotate-half folded into the table: x*cos + swap_halves(x)*signed_sin.
        sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        self.cos, self.sin = cos.to(self.device, dtype), sin.to(self.device, dtype)
        if self.fast_path is not None:
            self.fast_path.set_rope(self.cos, self.sin)
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        # On a GPU, pure decode steps replay CUDA graphs (cuda_graphs.py): launches, not the GPU, bound them.
        self.graphs = DecodeGraphs(self) if cuda_graphs and self.device.type == "cuda" else None
        # (request_id, export tensor) -> its DeviceExport or None: set by the engine (kv_export.py)
        self.new_export: Any = None

    @staticmethod
    def _layer(get, get_matrix, prefix: str, packed: bool) -> LayerWeights:
        gate, up = f"{prefix}.mlp.gate_proj.weight", f"{prefix}.mlp.up_proj.weight"
        return LayerWeights(
            input_norm=get(f"{prefix}.input_layernorm.weight"),
            qkv=get_matrix(*(f"{prefix}.self_attn.{p}_proj.weight" for p in "qkv")),
            o=get_matrix(f"{prefix}.self_attn.o_proj.weight"),
            post_norm=get(f"{prefix}.post_attention_layernorm.weight"),
            gate_up=None if packed else get_matrix(gate, up),
            down=get_matrix(f"{prefix}.mlp.down_proj.weight"),
            gate=get_matrix(gate) if packed else None,
            up=get_matrix(up) if packed else None,
        )

    def new_kv(self, capacity: int) -> torch.Tensor:
        """A per-sequence cache [layers, 2, kv_heads, capacity, head_dim] (the export layout)."""
        c = self.config
        return torch.empty(c.num_layers, 2, c.num_kv_heads, capacity, c.head_dim,
                           dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        return self.forward_eager(batch)

    @torch.inference_mode()
    def forward_eager(self, batch: ForwardBatch) -> torch.Tensor:
        return self.head(self.run_layers(self.embed[batch.token_ids], batch), batch)

    def run_layers(self, x: torch.Tensor, batch: ForwardBatch, layers: range | None = None) -> torch.Tensor:
        """The hidden states [tokens, hidden] after `layers` (default: all), from `x` before them,
        writing those layers' KV. A prompt's layers may run on two runners, each its own range:
        the hidden states are all that crosses (tests/nodes/engines/test_llama_layers.py). A pure
        decode step on the bf16 kernels updates `x` in place. No inference-mode context of its
        own (nor `head`): `forward` enters one per step, and each costs ~3 µs."""
        c = self.config
        cos = self.cos[batch.positions][:, None, :]
        sin = self.sin[batch.positions][:, None, :]
        num_tokens = x.shape[0]
        # Linear kernels for pure decode steps only: a prompt's rows take oneDNN's path whatever their
        # number, so its KV is the same bits whether a prefix of it came from the prefix cache or not.
        fast = (self.fast_path if self.fast_path is not None and not batch.spans
                and self.fast_path.takes_rows(num_tokens) else None)
        exports = [span for span in batch.spans if span.export is not None]
        for index in layers if layers is not None else range(c.num_layers):
            layer = self.layers[index]
            qkv = fast.qkv(index, x) if fast is not None else self._linear(self._norm(x, index), layer.qkv)
            if self.fast_path is not None and not batch.spans and batch.decode is not None:   # pure decode: one kernel
                group = batch.decode   # any batch size: it streams the KV faster than SDPA does
                attn = self.fast_path.decode_attention(index, qkv, group.positions, group.slots, group.cache, c.num_heads)
            elif self.fused and batch.decode is None:   # pure prefill: RoPE and the KV writes in one kernel
                attn = self._fused_prefill_attention(index, qkv, batch)
            else:
                # q and k rotate together: one set of elementwise ops instead of two.
                qk = apply_rope(qkv[:, :self.q_size + self.kv_size].view(num_tokens, -1, c.head_dim), cos, sin)
                q, k = qk[:, :c.num_heads], qk[:, c.num_heads:]
                v = qkv[:, self.q_size + self.kv_size:].view(num_tokens, c.num_kv_heads, c.head_dim)
                attn = self._attention(index, q, k, v, batch)
            if fast is not None:
                x = fast.mlp(index, fast.attn_out(index, attn, x))
            else:
                x = self._add_linear(x, attn, layer.o)
                x = self._mlp(x, self._norm(x, index, post=True), layer)
            for span in exports:   # this layer's KV of the span is final: it may leave now
                span.export.layer_done(index, span.start, span.start + span.num_tokens)
        return x

    def head(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Logits [num_sampled, vocab] float32 of `batch.sample_rows` from the last layer's states."""
        c = self.config
        if not len(batch.sample_rows):
            return torch.empty(0, c.vocab_size)
        if self.fast_path is not None and self.fast_path.takes_rows(len(batch.sample_rows)):
            # A prompt's last token(s) too, where the plan gives that many rows to the linear kernel.
            return self.fast_path.logits(x[batch.sample_rows]).float()
        last = rms_norm(x[batch.sample_rows], self.norm, c.rms_norm_eps)
        return self._linear(last, self.lm_head).float()

    def _norm(self, x: torch.Tensor, index: int, post: bool = False) -> torch.Tensor:
        if self.fused and self.fast_path is not None:   # the kernels' RMSNorm, bit-identical to rms_norm
            return self.fast_path.rms_norm(index, x, post)
        layer = self.layers[index]
        return rms_norm(x, layer.post_norm if post else layer.input_norm, self.config.rms_norm_eps)

    def _fused_prefill_attention(self, layer: int, qkv: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        assert self.fast_path is not None   # only a runner with the bf16 kernels gets here
        outputs = []
        for span in batch.spans:
            rows = slice(span.row, span.row + span.num_tokens)
            q = self.fast_path.rope_and_cache(qkv[rows], span.start, self.config.num_heads, span.kv[layer])
            outputs.append(self._attend_span(layer, q, span))
        if len(outputs) == 1 and outputs[0].shape[0] == qkv.shape[0]:
            return outputs[0]   # one prompt fills the step: no copy into a batch-wide buffer
        out = torch.empty(qkv.shape[0], self.q_size, dtype=qkv.dtype, device=qkv.device)
        for span, attn in zip(batch.spans, outputs, strict=True):
            out[span.row:span.row + span.num_tokens] = attn
        return out

    def _add_linear(self, residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """residual + x @ weight.T (one fused oneDNN call with packed weights)."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, None, "add")
        return residual + self._linear(x, weight)

    def _mlp(self, residual: torch.Tensor, h: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        """residual + SwiGLU(h). Packed: silu and the gating product run as GEMM epilogues, which
        made the block 2.7x faster for a 1024-token prompt (no separate elementwise passes)."""
        if self.packed:
            pointwise = torch.ops.mkldnn._linear_pointwise
            gated = pointwise.binary(h, pointwise(h, layer.gate, None, "swish", [], ""), layer.up, None, "mul")
            return pointwise.binary(gated, residual, layer.down, None, "add")
        assert layer.gate_up is not None   # plain weights have it
        gate, up = self._linear(h, layer.gate_up).chunk(2, dim=-1)
        return residual + self._linear(F.silu(gate) * up, layer.down)

    def _attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   batch: ForwardBatch) -> torch.Tensor:
        if not batch.spans and batch.decode is not None:   # a pure decode step: rows are the decode rows
            return self._decode_attention(layer, q, k, v, batch.decode, all_rows=True)
        out = torch.empty(q.shape[0], self.q_size, dtype=q.dtype, device=q.device)
        for span in batch.spans:
            rows = slice(span.row, span.row + span.num_tokens)
            out[rows] = self._span_attention(layer, q[rows], k[rows], v[rows], span)
        if batch.decode is not None:
            out[batch.decode.rows] = self._decode_attention(layer, q, k, v, batch.decode)
        return out

    def _span_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        span: PrefillSpan) -> torch.Tensor:
        cache = span.kv[layer]
        cache[0, :, span.start:span.start + span.num_tokens] = k.transpose(0, 1)
        cache[1, :, span.start:span.start + span.num_tokens] = v.transpose(0, 1)
        return self._attend_span(layer, q.transpose(0, 1), span)

    def _attend_span(self, layer: int, q: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        """A span's queries q [heads, tokens, head_dim] over its cache (its own k and v written), on
        the tiled kernel where the fast path attends (kernels.dispatch), else SDPA.
        Every prefill span takes this one choice, alone or beside decode rows: in bf16 a recovery
        prefill on a decode node must round as the prefill node did, or failover changes texts."""
        if self.fast_path is not None and self.fast_path.attends:
            return self.fast_path.prefill_attention(q.contiguous(), span.kv[layer], span.start)
        return self._span_sdpa(layer, q, span)

    def _span_sdpa(self, layer: int, q: torch.Tensor, span: PrefillSpan) -> torch.Tensor:
        """A span's queries q [heads, tokens, head_dim] over its cache, its own k and v already written."""
        start, end = span.start, span.start + span.num_tokens
        cache = span.kv[layer]
        mask = None
        if start and span.num_tokens > 1:
            # Query i (absolute position start + i) sees keys 0..start + i.
            keys = torch.arange(end, device=q.device)
            mask = keys[None, :] <= (start + torch.arange(span.num_tokens, device=q.device))[:, None]
        # 4-D inputs: with 3-D ones CPU SDPA falls back to the unfused math kernel (6x slower).
        attn = F.scaled_dot_product_attention(
            q[None], cache[None, 0, :, :end], cache[None, 1, :, :end], attn_mask=mask,
            is_causal=(start == 0 and span.num_tokens > 1), enable_gqa=True)[0]
        return attn.transpose(0, 1).reshape(span.num_tokens, self.q_size)

    def _decode_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          group: DecodeGroup, all_rows: bool = False) -> torch.Tensor:
        c = self.config
        if all_rows and self.f32_attends and group.cache.is_contiguous():
            out = torch.empty(q.shape[0], self.q_size, dtype=q.dtype)
            f32_attention.decode_attention(q.contiguous().numpy(), k.contiguous().numpy(), v.contiguous().numpy(),
                                           group.positions.numpy(), group.slots.numpy(), group.cache.numpy(),
                                           layer, out.numpy(), self.f32_prefetch)
            return out
        if not all_rows:
            q, k, v = q[group.rows], k[group.rows], v[group.rows]
        k_cache, v_cache = group.cache[layer, :group.num_slots, 0], group.cache[layer, :group.num_slots, 1]
        k_cache[group.slots, :, group.positions] = k
        v_cache[group.slots, :, group.positions] = v
        # GQA without copying KV. float32: the query heads sharing a KV head act as that head's
        # query rows; bf16: SDPA's own GQA (20% faster there, 30% slower in float32; measured).
        heads, rows = ((c.num_heads, 1) if self.dtype != torch.float32
                       else (c.num_kv_heads, c.num_heads // c.num_kv_heads))
        q_rows = q.reshape(-1, heads, rows, c.head_dim)
        if group.dense:
            q_slots = q_rows
        else:
            q_slots = q_rows.new_zeros(group.num_slots, heads, rows, c.head_dim)
            q_slots[group.slots] = q_rows
        max_len = group.max_len
        attn = F.scaled_dot_product_attention(q_slots, k_cache[:, :, :max_len], v_cache[:, :, :max_len],
                                              attn_mask=group.attention_mask(q.dtype), enable_gqa=heads != c.num_kv_heads)
        if not group.dense:
            attn = attn[group.slots]
        return attn.reshape(-1, self.q_size)
