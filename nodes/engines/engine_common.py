"""What every engine shares without importing a runner: dtype names and devices.

`resolve_dtype("auto", device)` is the dtype the built-in engine runs fastest in here, chosen by
`make bench-engine` on three instruction sets (docs/BENCHMARKS.md, "Which dtype `[engine] dtype =
"auto"` picks"): bfloat16 on a GPU, and on a CPU whose oneDNN multiplies bf16 in hardware, with AMX tiles
(prefill 4-5.7x float32's speed) or AVX512-BF16 alone (prefill 0.84x float32's, but decode 1.7-2.4x
from half the bytes); float32 on other CPUs, where oneDNN emulates bf16 (prefill 0.31x float32).
It follows `ONEDNN_MAX_CPU_ISA` when that caps oneDNN below AMX or AVX512-BF16.

The CPU's features are read by kernels.cpu alone: `PDBUS_NO_AMX=1` makes pdbus behave as on a CPU
without AMX (the kernels, `auto`'s choice); with `ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` oneDNN leaves
its tiles too (`make test-no-amx`).

Kept apart from `llama_engine.py` on purpose: the built-in runner loads numba kernels at import, and vLLM
0.32's start-up (which rebinds kernels across every loaded module) fails once numba's llvmlite is
loaded, so the vLLM adapter must be importable without the built-in runner.
"""

from __future__ import annotations

import torch

from nodes.engines.kernels.cpu import onednn_bf16

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
        return "bfloat16" if not str(device).startswith("cpu") or onednn_bf16() else "float32"
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (choose from auto, {', '.join(DTYPES)})")
    return name
