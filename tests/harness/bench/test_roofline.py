"""The rooflines bench-engine prints: a causal prefill's attention FLOPs, the linear layers' FLOPs,
and the attention charged at the rate torch.matmul reached on the weights."""

from __future__ import annotations

from harness.bench import roofline


def test_the_attention_roofline_charges_causal_flops_at_the_linear_layers_rate():
    import torch

    from nodes.engines.model_loader import build_tiny_model
    config = build_tiny_model().config
    # 3 tokens: query i sees i + 1 keys -> 6 (query, key) pairs, 4 * head_dim FLOPs each.
    assert roofline.attention_flops(config, 3) == 6 * 4 * config.head_dim * config.num_heads * config.num_layers
    weights = [torch.zeros(8, 4), torch.zeros(2, 4), torch.zeros(16, 4)]   # two layers' matrices, the head
    assert roofline.linear_flops(weights, 10, 1) == 2 * 10 * (32 + 8) + 2 * 64
    gemm_s = 1e-3
    rate = roofline.linear_flops(weights, 3, 1) / gemm_s
    assert roofline.roofline_with_attention_seconds(config, weights, 3, gemm_s) == gemm_s + roofline.attention_flops(config, 3) / rate
