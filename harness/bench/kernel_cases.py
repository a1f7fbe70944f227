"""The pairs kernel_bench times: each kernel the plan selects, beside torch.compile of the path it replaces.

Contract: `build(operation, dtype, plan, sizes)` returns, for one of `OPERATIONS` under the plan
of that dtype ("bfloat16" or "float32"), `Case`s and `Skip`s (an operation the plan gives to torch
on this CPU). A Case's `kernel()` and `reference()` (torch's path) each run the operation once on
the same inputs (separate output and cache buffers); `check()` runs both and returns None when their outputs agree
(bf16 within `BF16_ULPS` ulps of the output's largest value, float32 within `F32_RELATIVE` of it,
int8 codes within 1), else what differs. The torch side is what LlamaRunner (or TorchQuantizer)
runs in place of the kernel (kernel_torch), compiled at its first call: make that call under
`kernel_torch.inductor_settings()`. Shapes are SmolLM2-135M's (`SMOLLM2`); weights and activations
are random (speed does not depend on values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import torch

from bus.kv.layout import chunk_bytes_for, plan_chunks
from bus.kv.quant import max_payload_sizes
from harness.bench import kernel_torch as tm
from harness.bench.kernel_torch import EPS, HIDDEN, KV, KV_SIZE, Q_SIZE, SMOLLM2, D, H
from nodes.engines.kernels.decode_attention import bf16 as decode_bf16
from nodes.engines.kernels.decode_attention import f32 as decode_f32
from nodes.engines.kernels.dispatch import KernelPlan
from nodes.engines.kernels.fast_path import Bf16FastPath, bits
from nodes.engines.kernels.linear import dot_f32
from nodes.engines.kernels.norm_rope import bf16 as norm_rope
from nodes.engines.kernels.prefill_attention import tiled
from nodes.engines.kv_quant import TorchQuantizer

BF16_ULPS = 4
F32_RELATIVE = 2.0**-13
Output = torch.Tensor | tuple[torch.Tensor, ...]   # what the two sides of a `pair` return


@dataclass(frozen=True, slots=True)
class Sizes:
    # Layers a decode-sized call runs: a step streams 30 layers' weights and KV from memory, so a
    # call reads more than the last-level cache (32 MiB on the CPUs measured; 8 layers' linear
    # weights are 56 MB of bf16, 16 layers of a batch-8, 512-key KV 48 MB), not one layer from cache.
    linear_layers: int
    attention_layers: int
    rows: tuple[int, ...]   # decode rows of the linear layers
    batch: int              # decode attention's sequences
    context: int            # keys each decode row attends, its own included
    prompt: int             # prefill tokens (prefill attention, norm_rope)
    kv_layers: int          # the int8 codec's KV: [kv_layers, 2, 3, kv_tokens, 64]
    kv_tokens: int
    vocab: int


FULL = Sizes(8, 16, (1, 2, 8), 8, 512, 512, SMOLLM2.num_layers, 512, SMOLLM2.vocab_size)
QUICK = Sizes(1, 1, (1,), 2, 64, 64, 2, 64, 4096)


@dataclass(frozen=True, slots=True)
class Case:
    operation: str
    module: str
    dtype: str
    shape: str
    kernel: Callable[[], object]
    reference: Callable[[], object]   # torch's path, compiled
    check: Callable[[], str | None]
    whole_step: bool = False          # a decode step of the engine against its torch linear (kernel_steps)


@dataclass(frozen=True, slots=True)
class Skip:
    operation: str
    dtype: str
    reason: str


def close(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None where got is within BF16_ULPS bf16 ulps (float32: F32_RELATIVE) of want's largest |value|."""
    scale = want.float().abs().max().item()
    if want.dtype == torch.bfloat16:   # bf16 keeps 8 significant bits: an ulp at 2**e is 2**(e - 7)
        tolerance = BF16_ULPS * 2.0 ** (math.floor(math.log2(scale)) - 7) if scale > 0 else 0.0
    else:
        tolerance = F32_RELATIVE * scale
    err = (got.float() - want.float()).abs().max().item()
    return None if err <= tolerance else f"max |diff| {err:.3g} at scale {scale:.3g} (> {tolerance:.3g})"


def checker(kernel: Callable[[], Output], reference: Callable[[], Output]) -> Callable[[], str | None]:
    """Runs both once (compiling each) and compares their outputs, a tensor or a tuple of them."""
    def check() -> str | None:
        got, want = kernel(), reference()
        pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]
        if isinstance(got, tuple):
            pairs = zip(got, want, strict=True)
        else:
            assert isinstance(want, torch.Tensor), "a tensor against a tuple of them"
            pairs = [(got, want)]
        return next((error for a, b in pairs if (error := close(a, b))), None)
    return check


def pair(operation: str, module: str, dtype: str, shape: str, kernel: Callable[[], Output],
         reference: Callable[[], Output]) -> Case:
    """A Case whose check compares the two sides' outputs with `close`."""
    return Case(operation, module, dtype, shape, kernel, reference, checker(kernel, reference))


def linear_bf16(plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    if not plan.fast_bf16:
        return [Skip("linear", "bfloat16", f"the plan's linear is {plan.linear!r}")]
    config = replace(SMOLLM2, num_layers=sizes.linear_layers, vocab_size=sizes.vocab)
    w = tm.random_weights(config, torch.bfloat16)
    fast = Bf16FastPath(config, w.__getitem__, plan)
    layers = tm.compiled(tm.LayerLinears([tm.layer_weights(w, i) for i in range(config.num_layers)]), linear=True)
    head = tm.compiled(tm.NormHead(norm=w["model.norm.weight"], head=w["model.embed_tokens.weight"]), linear=True)
    cases: list[Case | Skip] = []
    for rows in sizes.rows:
        x, attn = tm.randn(rows, config.hidden_size), tm.randn(rows, Q_SIZE, seed=2)
        residual = torch.empty_like(x)

        def kernel(x=x, attn=attn, residual=residual) -> tuple[torch.Tensor, torch.Tensor]:
            residual.copy_(x)   # the kernels add into the residual in place: each call starts alike
            for i in range(config.num_layers):
                qkv = fast.qkv(i, residual)
                fast.mlp(i, fast.attn_out(i, attn, residual))
            return residual, qkv

        def reference(x=x, attn=attn) -> tuple[torch.Tensor, torch.Tensor]:
            out = layers(x, attn)
            return out[0], out[-1]

        module = f"linear.{fast.plan.linear}"
        cases.append(pair("linear", module, "bfloat16", f"{config.num_layers} layers, {rows}-row step", kernel,
                          reference))
        logits, head_logits = (lambda x=x: fast.logits(x)), (lambda x=x: head(x))
        cases.append(pair("linear", module, "bfloat16", f"norm + LM head {config.vocab_size}x576, {rows}-row step",
                          logits, head_logits))
    return cases


def linear_f32(plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    if plan.linear != "dot_f32":
        return [Skip("linear", "float32", f"the plan's linear is {plan.linear!r}")]
    config = replace(SMOLLM2, num_layers=sizes.linear_layers, vocab_size=sizes.vocab)
    w = tm.random_weights(config, torch.float32)
    mats = [tm.layer_weights(w, i) for i in range(config.num_layers)]
    matrices = [(m["qkv"], m["o"], torch.cat([m["gate"], m["up"]]), m["down"]) for m in mats]
    head_w = w["model.embed_tokens.weight"]
    small = dot_f32.SmallLinear([head_w, *(m for layer in matrices for m in layer)])
    layers, head = tm.compiled(tm.Linears(mats), linear=True), tm.compiled(tm.Head(head=head_w), linear=True)
    cases: list[Case | Skip] = []
    for rows in sizes.rows:
        x, attn = tm.randn(rows, HIDDEN, dtype=torch.float32), tm.randn(rows, Q_SIZE, dtype=torch.float32, seed=2)
        gated = tm.randn(rows, config.intermediate_size, dtype=torch.float32, seed=3)

        def kernel(x=x, attn=attn, gated=gated) -> tuple[torch.Tensor, ...]:
            return tuple(small(v, m) for ms in matrices for v, m in zip((x, attn, x, gated), ms, strict=True))

        def reference(x=x, attn=attn, gated=gated) -> tuple[torch.Tensor, ...]:
            return layers(x, attn, gated)

        cases.append(pair("linear", "linear.dot_f32", "float32", f"{config.num_layers} layers, {rows}-row step",
                          kernel, reference))
        logits, head_logits = (lambda x=x: small(x, head_w)), (lambda x=x: head(x))
        cases.append(pair("linear", "linear.dot_f32", "float32", f"LM head {config.vocab_size}x576, {rows}-row step",
                          logits, head_logits))
    return cases


def decode_attention(dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    wanted = "bf16" if dtype == "bfloat16" else "f32"
    if plan.decode_attention != wanted:
        return [Skip("decode_attention", dtype, f"the plan's decode_attention is {plan.decode_attention!r}")]
    layers, rows, keys = sizes.attention_layers, sizes.batch, sizes.context
    torch_dtype = getattr(torch, dtype)
    cache = tm.randn(layers, rows, 2, KV, keys, D, dtype=torch_dtype)
    positions, slots = torch.full((rows,), keys - 1), torch.arange(rows)
    kernel_cache, out = cache.clone(), torch.empty(rows, Q_SIZE, dtype=torch_dtype)
    if dtype == "bfloat16":
        cos, sin = tm.runner_rope_tables(keys, torch.bfloat16)
        qkv = tm.randn(layers, rows, Q_SIZE + 2 * KV_SIZE, seed=4)
        args = (bits(qkv), bits(cos), bits(sin), positions.numpy(), slots.numpy(), bits(kernel_cache))
        attend = tm.compiled(tm.DecodeAttentionBf16(cos=cos, sin=sin))

        out_bits = bits(out)

        def kernel() -> torch.Tensor:
            for layer in range(layers):
                decode_bf16.decode_attention(args[0][layer], *args[1:], layer, H, out_bits, decode_bf16.PAIRS,
                                             decode_bf16.PAIR_VALUES, plan.attention_prefetch)
            return out

        def reference() -> torch.Tensor:
            return [attend(qkv[layer], positions, slots, cache[layer]) for layer in range(layers)][-1]
    else:
        q, k, v = (tm.randn(layers, rows, n, D, dtype=torch.float32, seed=s) for n, s in ((H, 4), (KV, 5), (KV, 6)))
        arrays = (q.numpy(), k.numpy(), v.numpy())
        attend = tm.compiled(tm.DecodeAttentionF32())

        def kernel() -> torch.Tensor:
            for layer in range(layers):
                decode_f32.decode_attention(*(a[layer] for a in arrays), positions.numpy(), slots.numpy(),
                                            kernel_cache.numpy(), layer, out.numpy(), plan.attention_prefetch)
            return out

        def reference() -> torch.Tensor:
            return [attend(q[i], k[i], v[i], positions, slots, cache[i]) for i in range(layers)][-1]
    return [pair("decode_attention", f"decode_attention.{wanted}", dtype,
                 f"{layers} layers, batch {rows}, {keys} keys", kernel, reference)]


def prefill_attention(dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    if plan.prefill_attention == "torch":
        return [Skip("prefill_attention", dtype, "the plan's prefill_attention is 'torch'")]
    tokens = sizes.prompt
    q, cache = tm.randn(H, tokens, D), tm.randn(2, KV, tokens, D, seed=4)
    workspace = tiled.Workspace(max(1024, 1 << (tokens - 1).bit_length()))   # as Bf16FastPath sizes it
    q_bits, cache_bits = bits(q), bits(cache)
    attend = tm.compiled(tm.PrefillAttention())

    def kernel() -> torch.Tensor:
        out = torch.empty(tokens, Q_SIZE, dtype=torch.bfloat16)
        tiled.prefill_attention(q_bits, cache_bits[0], cache_bits[1], 0, bits(out), workspace)
        return out

    return [pair("prefill_attention", f"prefill_attention.tiled ({plan.prefill_attention})", dtype,
                 f"{tokens}-token causal prompt", kernel, lambda: attend(q, cache))]


def norm_rope_cases(dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    if plan.norm_rope != "bf16":
        return [Skip("norm_rope", dtype, f"the plan's norm_rope is {plan.norm_rope!r}")]
    tokens = sizes.prompt
    x, weight = tm.randn(tokens, HIDDEN), 1 + 0.1 * tm.randn(HIDDEN, seed=2)
    norm, weight_bits = tm.compiled(tm.RmsNorm(weight=weight)), bits(weight)

    def kernel_norm() -> torch.Tensor:
        out = torch.empty_like(x)   # Bf16FastPath.rms_norm returns a new tensor
        norm_rope.rms_norm(bits(x), weight_bits, EPS, bits(out))
        return out

    cos, sin = tm.runner_rope_tables(tokens, torch.bfloat16)
    qkv, positions = tm.randn(tokens, Q_SIZE + 2 * KV_SIZE, seed=3), torch.arange(tokens)
    cache = torch.zeros(2, KV, tokens, D, dtype=torch.bfloat16)
    kernel_cache = cache.clone()
    rope, tables = tm.compiled(tm.RopeAndCache(cos=cos, sin=sin)), (bits(cos), bits(sin))

    def kernel_rope() -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.empty(H, tokens, D, dtype=torch.bfloat16)
        norm_rope.rope_and_cache(bits(qkv), *tables, 0, H, bits(q), bits(kernel_cache))
        return q, kernel_cache

    def reference_rope() -> tuple[torch.Tensor, torch.Tensor]:
        return rope(qkv, positions, cache), cache

    return [pair("norm_rope", "norm_rope.bf16.rms_norm", dtype, f"{tokens} x 576", kernel_norm,
                 lambda: norm(x)),
            pair("norm_rope", "norm_rope.bf16.rope_and_cache", dtype, f"{tokens} tokens", kernel_rope,
                 reference_rope)]


def _codes_close(got: list[list[np.ndarray]], want: list[list[np.ndarray]]) -> str | None:
    """int8 payloads: codes within 1 (rounding ties), params (float16) within one float16 ulp."""
    for (codes, params), (want_codes, want_params) in zip(got, want, strict=True):
        step = np.abs(codes.astype(np.int16) - want_codes.astype(np.int16)).max()
        p, wp = params.view(np.float16).astype(np.float32), want_params.view(np.float16).astype(np.float32)
        if step > 1 or not np.all(np.abs(p - wp) <= np.spacing(np.abs(wp).astype(np.float16)).astype(np.float32)):
            return f"codes differ by up to {step}, params by up to {np.abs(p - wp).max():.3g}"
    return None


def kv_int8(dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    """TorchQuantizer's `int8` mode both ways, over the chunks a sender plans: on kernels.kv_int8
    (`fast_int8`, what the plan gives it) and forced onto its torch.compile'd kernels."""
    if plan.kv_int8 != "numba":
        return [Skip("kv_int8", dtype, f"the plan's kv_int8 is {plan.kv_int8!r}")]
    kv = tm.randn(sizes.kv_layers, 2, KV, sizes.kv_tokens, D, dtype=getattr(torch, dtype))
    fast, slow = TorchQuantizer(compile=True), TorchQuantizer(compile=True)
    fast.fast_int8, slow.fast_int8 = True, False
    info = fast.kv_info(kv)
    specs = plan_chunks(info, chunk_bytes_for(info, "int8"))
    sizes_ = max_payload_sizes("int8", max(s.num_rows for s in specs), info)
    outs = {q: [np.empty(n, np.uint8) for n in sizes_] for q in (fast, slow)}

    def encoder(q: TorchQuantizer) -> Callable[[], list]:
        return lambda: [q.encode(kv, info, spec, "int8", outs[q]) for spec in specs]

    def payloads(q: TorchQuantizer) -> list[list[np.ndarray]]:
        return [[np.frombuffer(memoryview(f).cast("B"), np.uint8).copy() for f in p.frames] for p in encoder(q)()]

    sent = payloads(fast)
    dst = {q: torch.empty_like(kv) for q in (fast, slow)}

    def decoder(q: TorchQuantizer) -> Callable[[], torch.Tensor]:
        def decode() -> torch.Tensor:
            for spec, payload in zip(specs, sent, strict=True):
                q.decode(payload, info, spec, "int8", "f16", dst[q])
            return dst[q]
        return decode

    shape = f"KV {'x'.join(map(str, kv.shape))}, {len(specs)} chunks"
    return [Case("kv_int8", "kv_int8.encode", dtype, shape, encoder(fast), encoder(slow),
                 lambda: _codes_close(payloads(fast), payloads(slow))),
            pair("kv_int8", "kv_int8.decode", dtype, shape, decoder(fast), decoder(slow))]


OPERATIONS: dict[str, Callable[[str, KernelPlan, Sizes], list[Case | Skip]]] = {
    "linear": lambda dtype, plan, sizes: (linear_bf16 if dtype == "bfloat16" else linear_f32)(plan, sizes),
    "decode_attention": decode_attention,
    "prefill_attention": prefill_attention,
    "norm_rope": norm_rope_cases,
    "kv_int8": kv_int8,
}


def build(operation: str, dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    return OPERATIONS[operation](dtype, plan, sizes)
