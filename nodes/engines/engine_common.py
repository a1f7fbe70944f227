"""What every engine shares without importing a runner: dtype names and devices.

`resolve_dtype("auto", device)` is the dtype the built-in engine runs fastest in here, chosen by
`make bench-engine` on three instruction sets (docs/BENCHMARKS.md, "Which dtype `[engine] dtype =
"auto"` picks"): bfloat16 on a GPU, and on a CPU whose oneDNN multiplies bf16 in hardware, with AMX tiles
(prefill 4-5.7x float32's speed) or AVX512-BF16 alone (prefill 0.84x float32's, but decode 1.7-2.4x
from half the bytes); float32 on other CPUs, where oneDNN emulates bf16 (prefill 0.31x float32).
It follows `ONEDNN_MAX_CPU_ISA` when that caps oneDNN below AMX or AVX512-BF16.

`PDBUS_NO_AMX=1` makes pdbus behave as on a CPU without AMX (the numba tile kernels, `auto`'s
choice); with `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` oneDNN leaves its tiles too (`make test-no-amx`).
Tests and benchmarks use it to check the paths that such a machine takes.

Kept apart from `llama_engine.py` on purpose: the built-in runner loads numba kernels at import, and vLLM
0.32's start-up (which rebinds kernels across every loaded module) fails once numba's llvmlite is
loaded, so the vLLM adapter must be importable without the built-in runner.
"""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """`[engine] device` as a torch device: "cpu", "cuda" or "cuda:N". ValueError, saying what to do,
    for an unknown name or a GPU this torch cannot see (a CPU build, no driver, no such index), so a
    node exits with one line instead of a traceback from deep inside the weights' first copy."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown [engine] device {name!r}: use \"cpu\", \"cuda\" or \"cuda:N\"")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"[engine] device = {name!r}, but torch {torch.__version__} sees no CUDA GPU "
                             "(a CPU build, or no driver): use device = \"cpu\"")
        if device.index is not None and device.index >= count:
            raise ValueError(f"[engine] device = {name!r}, but torch sees {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})")
    return device


def resolve_dtype(name: str, device: str = "cpu") -> torch.dtype:
    return DTYPES[resolve_dtype_name(name, device)]


def resolve_dtype_name(name: str, device: str = "cpu") -> str:
    """The dtype `name` stands for on `device` ("auto" decided, see above); ValueError if unknown."""
    if name == "auto":
        return "bfloat16" if not str(device).startswith("cpu") or cpu_has_bf16_matmul() else "float32"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (choose from auto, {', '.join(DTYPES)})")
    return name


def amx_disabled() -> bool:
    """`PDBUS_NO_AMX` set (to anything but "", "0"): act as on a CPU without AMX tiles."""
    return os.environ.get("PDBUS_NO_AMX", "") not in ("", "0")


def cpu_has_amx() -> bool:
    """AMX tiles (oneDNN's fastest bf16 matmul), as torch detects them, unless switched off."""
    return not amx_disabled() and _onednn_may_use("AMX") and _probe("_is_amx_tile_supported")


def cpu_has_bf16_matmul() -> bool:
    """bf16 multiplied in hardware by oneDNN: AMX tiles or AVX512-BF16 (else oneDNN emulates it)."""
    return cpu_has_amx() or (_onednn_may_use("BF16") and _probe("_is_avx512_bf16_supported"))


def _probe(name: str) -> bool:
    probe = getattr(torch.cpu, name, None)
    return bool(probe and probe())


def _onednn_may_use(feature: str) -> bool:
    """Whether `ONEDNN_MAX_CPU_ISA` (unset: no cap) lets oneDNN use AMX, or bf16 instructions.
    torch's probes report the CPU, not that cap."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in ("", "ALL", "DEFAULT"):
        return True
    if feature == "AMX":
        return "AMX" in cap
    return "AMX" in cap or "BF16" in cap or "FP16" in cap or cap.startswith("AVX10")
