"""The KV path's stages and the device's physical limits, timed on one device (part of
`make bench-kv-device`, harness/bench/kv_device_bench.py).

Contract: `measure_limits(device)` -> GB/s of a device memcpy and of pinned device-to-host and
host-to-device copies (on a CPU, all three are host memcpy); `measure_stages(engine, tokens,
device)` -> {"T stage": (seconds, bytes)} for a T-token KV of the engine's layout: device quantize
(int8 codes and float16 params from the engine's dtype, nodes/engines/kv_device.py; bytes = the
KV's), D2H and H2D (the wire's bytes: codes and params), dequantize (into the engine's dtype; bytes
= the KV's). Each is the best of 5 after a warm-up, the device synchronized around it
(harness/bench/roofline.best_time).
"""

from __future__ import annotations

import torch

from harness.bench.roofline import best_time
from nodes.engines import kv_device

LIMIT_BYTES = 256 << 20
REPEATS = 5


def _host(shape: tuple[int, ...] | int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=device.startswith("cuda"))


def measure_limits(device: str) -> dict[str, float]:
    source = torch.empty(LIMIT_BYTES, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    host = _host(LIMIT_BYTES, torch.uint8, device).fill_(2)
    return {
        "memcpy_GBps": LIMIT_BYTES / best_time(lambda: target.copy_(source), REPEATS) / 1e9,
        "d2h_GBps": LIMIT_BYTES / best_time(lambda: host.copy_(source, non_blocking=True), REPEATS) / 1e9,
        "h2d_GBps": LIMIT_BYTES / best_time(lambda: target.copy_(host, non_blocking=True), REPEATS) / 1e9,
    }


def measure_stages(engine, tokens: list[int], device: str) -> dict[str, tuple[float, int]]:
    stages: dict[str, tuple[float, int]] = {}
    for num_tokens in tokens:
        kv = torch.randn(engine.kv_layout.shape(num_tokens), device=device).to(engine.kv_layout.dtype)
        stages |= {f"{num_tokens} {stage}": figures for stage, figures in _stages_of(kv, device).items()}
    return stages


def _stages_of(kv: torch.Tensor, device: str) -> dict[str, tuple[float, int]]:
    rows = kv.view(-1, kv.shape[-1])
    codes = torch.empty(rows.shape, dtype=torch.uint8, device=device)
    lo = torch.empty(rows.shape[0], dtype=torch.float16, device=device)
    hi = torch.empty_like(lo)
    pairs = [(_host(t.shape, t.dtype, device), t) for t in (codes, lo, hi)]   # (host, device)
    out = torch.empty_like(kv)
    kv_bytes = kv.numel() * kv.element_size()
    wire = codes.numel() + 4 * rows.shape[0]

    def d2h() -> None:
        for host, on_device in pairs:
            host.copy_(on_device, non_blocking=True)

    def h2d() -> None:
        for host, on_device in pairs:
            on_device.copy_(host, non_blocking=True)

    return {
        "device quantize": (best_time(lambda: kv_device.encode_int8_rows(rows, codes, lo, hi), REPEATS), kv_bytes),
        "D2H": (best_time(d2h, REPEATS), wire),
        "H2D": (best_time(h2d, REPEATS), wire),
        "dequantize": (best_time(lambda: kv_device.decode_int8_rows(codes, lo, hi, out), REPEATS), kv_bytes),
    }
