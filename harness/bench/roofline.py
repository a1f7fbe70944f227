"""The references `make bench-engine` prints beside the engine: best-of-N timing, the single-core
read bandwidth, and the GEMM rooflines.

Contract: `best_time(fn, repeats)` is the best of `repeats` timed calls after a warm-up;
`read_bandwidth(weights)` the read bandwidth of a 1 GiB buffer and of one pass over the weights
(GB/s; one thread on a CPU, on a GPU its memory's); `plain_weights(model, dtype)` the model's linear weights fused as the engine
fuses them, the head last; `gemm_seconds(weights, tokens, logit_rows)` torch.matmul of exactly
those layers; `linear_flops` their FLOPs, `attention_flops(config, tokens)` a causal prefill's
attention products, `roofline_with_attention_seconds` the linear roofline plus the attention's
FLOPs at the rate torch.matmul reached on the weights (why that rate: its docstring).
`peak_mac_rate(dtype)` is the best multiply-add rate torch.matmul reaches on this core (or GPU) (a square
product, oneDNN's or MKL's best case); `decode_step_floor(config, weights, batch, context, peak,
bandwidth_gbs)` the least time a decode step of `batch` rows at `context` tokens of KV could take:
its multiply-adds (every linear layer and the head for each row, attention's two products) at that
peak, or the bytes it must read (weights once, every row's K and V) at the read bandwidth,
whichever is longer. Neither can be beaten, so no engine reaches the floor; it bounds what any
batch-32 / batch-1 ratio can be on this core.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize() -> None:
    """Wait for queued GPU work (a no-op without CUDA): timings on a GPU must include it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def best_time(fn: Callable[[], object], repeats: int, min_seconds: float = 0.0) -> float:
    """Best of `repeats` timed calls after one warm-up (the least disturbed run on a shared machine)."""
    fn()
    synchronize()
    best = float("inf")
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        best = min(best, time.perf_counter() - t0)
        if i >= 1 and time.perf_counter() - start > max(min_seconds, 30):
            break
    return best


def read_bandwidth(weights: list[torch.Tensor]) -> dict[str, float]:
    """Read bandwidth, GB/s, on the weights' device (single-thread on a CPU): a 1 GiB buffer (DRAM,
    or the GPU's memory) and one pass over the weights."""
    buffer = torch.empty(256 * 1024 * 1024, device=weights[0].device).uniform_()
    dram = buffer.numel() * 4 / best_time(buffer.sum, 5) / 1e9
    del buffer
    num_bytes = sum(w.numel() * w.element_size() for w in weights)
    passes = num_bytes / best_time(lambda: [w.sum() for w in weights], 5) / 1e9
    return {"dram_gbs": dram, "weights_pass_gbs": passes}


def plain_weights(model, dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    """The model's linear weights as plain [out, in] tensors, fused the way the engine fuses them."""
    w = {k: v.to(device=device, dtype=dtype) for k, v in model.weights.items()}
    layers = []
    for i in range(model.config.num_layers):
        p = f"model.layers.{i}"
        layers += [torch.cat([w[f"{p}.self_attn.{x}_proj.weight"] for x in "qkv"]), w[f"{p}.self_attn.o_proj.weight"],
                   torch.cat([w[f"{p}.mlp.gate_proj.weight"], w[f"{p}.mlp.up_proj.weight"]]), w[f"{p}.mlp.down_proj.weight"]]
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return layers + [head]


def gemm_seconds(weights: list[torch.Tensor], num_tokens: int, num_logit_rows: int) -> float:
    """torch.matmul of exactly the model's linear layers for `num_tokens` rows, every layer."""
    inputs: dict[int, torch.Tensor] = {}
    for w in weights:
        inputs.setdefault(w.shape[1], torch.randn(num_tokens, w.shape[1], dtype=w.dtype, device=w.device))
    *layers, head = weights
    last = inputs[head.shape[1]][:num_logit_rows]

    def run() -> None:
        for w in layers:
            torch.matmul(inputs[w.shape[1]], w.t())
        torch.matmul(last, head.t())
    return best_time(run, 5)


def linear_flops(weights: list[torch.Tensor], num_tokens: int, num_logit_rows: int) -> int:
    """Multiply-adds x 2 of what `gemm_seconds` times: every layer's matrices, the head for the logit rows."""
    *layers, head = weights
    return 2 * num_tokens * sum(w.numel() for w in layers) + 2 * num_logit_rows * head.numel()


def attention_flops(config, num_tokens: int) -> int:
    """Multiply-adds x 2 of a causal prefill's attention products, every layer and head: query i
    scores keys 0..i (q . k, head_dim each) and sums as many value rows."""
    pairs = num_tokens * (num_tokens + 1) // 2
    return 2 * 2 * config.head_dim * pairs * config.num_heads * config.num_layers


def roofline_with_attention_seconds(config, weights: list[torch.Tensor], num_tokens: int, gemm_s: float) -> float:
    """The linear layers' timed roofline plus the attention's products at the same GEMM rate. torch.matmul
    timed on attention's own block shapes is no roofline: 64 x 64 x n products run at about 40 % of
    the linear layers' rate in bf16 (and the engine's own kernel beats them), so their FLOPs are
    charged at the rate torch reaches on the model's weights."""
    rate = linear_flops(weights, num_tokens, 1) / gemm_s
    return gemm_s + attention_flops(config, num_tokens) / rate


def peak_mac_rate(dtype: torch.dtype, size: int = 1024, device: str = "cpu") -> float:
    """Multiply-adds per second of torch.matmul on a size x size x size product, best of 5."""
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    return size ** 3 / best_time(lambda: torch.matmul(a, b), 5)


def decode_step_floor(config, weights: list[torch.Tensor], batch: int, context: int, peak_macs: float,
                      bandwidth_gbs: float) -> dict[str, float]:
    """The floor of a decode step (module docstring): seconds, and the multiply-adds and bytes behind it."""
    element = weights[0].element_size()
    keys = context + 1   # the step's own token is attended to as well
    attention_macs = 2 * batch * config.num_layers * config.num_heads * keys * config.head_dim
    macs = linear_flops(weights, batch, batch) // 2 + attention_macs
    kv_bytes = batch * config.num_layers * 2 * config.num_kv_heads * keys * config.head_dim * element
    num_bytes = sum(w.numel() * w.element_size() for w in weights) + kv_bytes
    seconds = max(macs / peak_macs, num_bytes / (bandwidth_gbs * 1e9))
    return {"seconds": seconds, "macs": macs, "bytes": num_bytes}
