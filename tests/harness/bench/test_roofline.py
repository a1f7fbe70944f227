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


def test_a_decode_steps_floor_is_its_compute_or_its_reads_whichever_is_longer():
    import torch

    from nodes.engines.model_loader import build_tiny_model
    c = build_tiny_model().config
    weights = [torch.zeros(8, 4, dtype=torch.bfloat16), torch.zeros(16, 4, dtype=torch.bfloat16)]   # a layer, the head
    batch, context = 3, 9
    attention = 2 * batch * c.num_layers * c.num_heads * (context + 1) * c.head_dim   # q.k and the values
    macs = batch * (32 + 64) + attention
    kv_bytes = batch * c.num_layers * 2 * c.num_kv_heads * (context + 1) * c.head_dim * 2
    weight_bytes = (32 + 64) * 2
    slow_core = roofline.decode_step_floor(c, weights, batch, context, peak_macs=1e3, bandwidth_gbs=1e3)
    assert slow_core == {"seconds": macs / 1e3, "macs": macs, "bytes": weight_bytes + kv_bytes}
    slow_memory = roofline.decode_step_floor(c, weights, batch, context, peak_macs=1e15, bandwidth_gbs=1e-6)
    assert slow_memory["seconds"] == (weight_bytes + kv_bytes) / 1e3


def test_the_peak_rate_is_a_timed_square_product():
    import torch
    rate = roofline.peak_mac_rate(torch.float32, size=64)
    assert 1e6 < rate < 1e13
