"""The bf16 linear kernels' contract in float64 numpy: what linear.dot_bf16 and linear.amx compute,
rounded to bf16 where they (and torch's bf16 path) round: the norm's scale, the normed value after
the scale and after the weight, silu's output, and each result once. Sums are exact here; the
kernels' float32 sums in another order may land one bf16 step away. Same signature as the kernels
(bf16 values as uint16 bits; `out` written in place, and may be `residual`)."""

from __future__ import annotations

import numpy as np
import torch


def values(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).double().numpy()


def rounded(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bf16 value (ties to even), as float64."""
    return torch.from_numpy(np.asarray(x, np.float64)).to(torch.bfloat16).double().numpy()


def to_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.asarray(x, np.float64)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def normed(x: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    v = values(x)
    scale = rounded(1.0 / np.sqrt((v * v).mean(axis=1, keepdims=True) + eps))
    return rounded(rounded(v * scale) * values(norm_w))


def linear(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    out[:] = to_bits(values(x) @ values(w).T)


def norm_linear(x: np.ndarray, norm_w: np.ndarray, eps: float, w: np.ndarray, out: np.ndarray) -> None:
    out[:] = to_bits(normed(x, norm_w, eps) @ values(w).T)


def linear_add(x: np.ndarray, w: np.ndarray, residual: np.ndarray, out: np.ndarray) -> None:
    out[:] = to_bits(values(x) @ values(w).T + values(residual))


def norm_swiglu(x: np.ndarray, norm_w: np.ndarray, eps: float, w_gate: np.ndarray, w_up: np.ndarray,
                out: np.ndarray) -> None:
    h = normed(x, norm_w, eps)
    gate, up = h @ values(w_gate).T, h @ values(w_up).T
    out[:] = to_bits(up * rounded(gate / (1.0 + np.exp(-gate))))
