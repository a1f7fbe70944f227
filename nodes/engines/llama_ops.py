"""The Llama math outside the layer loop's matmuls, as Hugging Face's LlamaForCausalLM computes it.

Contract: `rms_norm(x, weight, eps)` (statistics in float32 whatever the dtype), `apply_rope(x, cos,
signed_sin)` (rotate-half RoPE), and `can_pack_weights` / `packed_linear` (oneDNN-packed bf16
weights on CPU). The compiled kernels (kernels/norm_rope, kernels/fast_path) are bit-identical to
rms_norm and apply_rope in bf16 and are tested against them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def can_pack_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """oneDNN-packed bf16 weights run CPU matmuls 1.2-1.9x faster than F.linear at decode sizes
    (measured with AMX; same results), so bf16 on CPU packs them when this torch can."""
    return (dtype == torch.bfloat16 and device.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm, statistics in float32 whatever the dtype (as Hugging Face does by hand).

    float32: the fused kernel, bit for bit what transformers computes. Other dtypes: a float32
    vector norm and one scale pass, 4x faster than the fused kernel on a 1024-token bf16 prompt
    (which upcasts the whole input) and within one bf16 rounding of it."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    scale = norm.square_().mul_(1.0 / x.shape[-1]).add_(eps).rsqrt_()
    return (x * scale.to(x.dtype)).mul_(weight)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face's x*cos + rotate_half(x)*sin, with rotate_half's minus sign kept in `signed_sin`."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return torch.addcmul(x * cos, swapped, signed_sin)
