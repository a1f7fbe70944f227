"""The linear kernels' second test: a whole decode step with and without them, as the engine runs it.

Contract: `step_cases(dtype, plan, sizes)` returns, where the plan gives the linear layers of `dtype`
to a kernel, one Case per step size in `sizes.rows`: a LlamaRunner over SmolLM2-135M's shapes
(random weights, all 30 layers) runs one pure decode step of that many rows, 512 keys each; the
kernel side is the runner as the plan builds it, the torch side the same runner with its linear
layers (and LM head) on torch's own path (oneDNN's packed bf16 GEMMs, MKL in float32) and every
other kernel unchanged. Each side's logits must agree within the kernels' rounding.

Why a second test: compiled torch is the bar a kernel must clear (kernel_cases), but what serves in
a deleted kernel's place is the engine's torch path, one call per operation. Where compiled torch
wins by compiling a whole layer (the norm fused in, no call between operations), the engine's
step can still be faster with the kernel; this row measures that, and docs/KERNELS.md says which
rule decided each kernel.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.bench.kernel_cases import Case, Sizes, Skip
from harness.bench.kernel_torch import SMOLLM2
from nodes.engines.forward_batch import DecodeGroup, ForwardBatch
from nodes.engines.kernels.dispatch import KernelPlan
from nodes.engines.llama import LlamaRunner
from nodes.engines.tiny import random_llama_weights

KERNELS = {"bfloat16": ("amx", "dot_bf16"), "float32": ("dot_f32",)}


def _runners(dtype: torch.dtype, sizes: Sizes) -> tuple[LlamaRunner, LlamaRunner]:
    config = SMOLLM2 if sizes.vocab == SMOLLM2.vocab_size else _smaller(sizes)
    weights = random_llama_weights(config, 0, torch.float32)
    with_kernel = LlamaRunner(config, weights, dtype=dtype, max_len=sizes.context + 8)
    on_torch = LlamaRunner(config, weights, dtype=dtype, max_len=sizes.context + 8)
    if on_torch.fast_path is not None:
        on_torch.fast_path.max_rows = 0          # bf16: the linear layers and head on oneDNN
    else:
        on_torch._linear = torch.nn.functional.linear   # float32: MKL, as without dot_f32
    return with_kernel, on_torch


def _smaller(sizes: Sizes):
    return replace(SMOLLM2, num_layers=2, vocab_size=sizes.vocab)


def _decode_batch(runner: LlamaRunner, rows: int, keys: int, dtype: torch.dtype) -> ForwardBatch:
    c = runner.config
    g = torch.Generator().manual_seed(rows)   # both sides get the same cache, each its own copy
    cache = (torch.randn(c.num_layers, rows, 2, c.num_kv_heads, keys + 1, c.head_dim, generator=g) * 0.5).to(dtype)
    positions = torch.full((rows,), keys)
    group = DecodeGroup(rows=torch.arange(rows), slots=torch.arange(rows), positions=positions, cache=cache,
                        num_slots=rows, lengths=None, max_len=keys + 1, dense=True)
    return ForwardBatch(torch.arange(rows) + 100, positions, torch.arange(rows), decode=group)


def step_cases(dtype: str, plan: KernelPlan, sizes: Sizes) -> list[Case | Skip]:
    if plan.linear not in KERNELS[dtype]:
        return [Skip("linear", dtype, f"decode step: the plan's linear is {plan.linear!r}")]
    torch_dtype = getattr(torch, dtype)
    with_kernel, on_torch = _runners(torch_dtype, sizes)
    cases: list[Case | Skip] = []
    for rows in sizes.rows:
        batch, kernel_batch = (_decode_batch(with_kernel, rows, sizes.context, torch_dtype) for _ in range(2))
        kernel, reference = (lambda b=kernel_batch: with_kernel.forward(b)), (lambda b=batch: on_torch.forward(b))
        cases.append(Case("linear", f"linear.{plan.linear}", dtype,
                          f"decode step, {rows} rows: vs the engine's torch linear", kernel, reference,
                          _logits_check(kernel, reference), whole_step=True))
    return cases


def _logits_check(kernel, reference):
    """Both sides' logits within 4 % of their scale: 30 layers of float32 sums in another order
    (bf16: rounded after every operation) move logits by more than a few ulps, never by that."""
    def check() -> str | None:
        got, want = kernel(), reference()
        scale = float(want.abs().max())
        error = float((got - want).abs().max())
        return None if error <= 0.04 * scale else f"logits differ by {error:.3g} at scale {scale:.3g}"
    return check

