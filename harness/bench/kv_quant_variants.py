"""Quantization variants for the quality benchmark only: group granularities pdbus does not ship.

Contract: `round_trip_variant(kv, name)` returns the KV after quantizing and dequantizing it with
the named scheme, in float32; the shipped modes (raw, bf16, int8, int8_sym) go through the real
codec instead (harness.bench.kv_quality). Variants: `int8_f32params` (per-token asymmetric with
float32 lo/hi), `int8_head` (one asymmetric range per head over all its tokens),
`int8_tensor` (one asymmetric range per layer's K or V). Per-channel schemes need every token
before encoding, so they cannot stream, and are not measured.
"""

from __future__ import annotations

import numpy as np


def _asym(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    low = values.min(axis=axes, keepdims=True)
    high = values.max(axis=axes, keepdims=True)
    step = (high - low) / 255
    safe = np.where(step > 0, step, 1)
    codes = np.clip(np.floor((values - low) / safe + 0.5), 0, 255)
    return (codes * step + low).astype(np.float32)


VARIANTS = {
    "int8_f32params": lambda kv: _asym(kv, (4,)),
    "int8_head": lambda kv: _asym(kv, (3, 4)),
    "int8_tensor": lambda kv: _asym(kv, (2, 3, 4)),
}


def round_trip_variant(kv: np.ndarray, name: str) -> np.ndarray:
    return VARIANTS[name](kv.astype(np.float32))
