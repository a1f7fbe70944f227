"""Rotary position embedding tables (cos, sin) per position, as Hugging Face's Llama computes them.

Contract: `rope_tables(config, max_len) -> (cos, sin)`, each float32 [max_len, head_dim] in the
rotate-half layout. Supports plain RoPE, "linear" scaling and Llama 3's "llama3" frequency scaling;
any other `rope_scaling` type raises `ValueError` naming it.
"""

from __future__ import annotations

import math

import torch

from nodes.engines.model_config import LlamaConfig


def inverse_frequencies(config: LlamaConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(config: LlamaConfig, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = inverse_frequencies(config)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()
