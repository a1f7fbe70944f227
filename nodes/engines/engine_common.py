"""What every engine shares without importing a runner: dtype names and the stats counters.

Kept apart from `engine.py` on purpose: the built-in runner loads numba kernels at import, and vLLM
0.32's start-up (which rebinds kernels across every loaded module) fails once numba's llvmlite is
loaded, so the vLLM adapter must be importable without the built-in runner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass(slots=True)
class EngineStats:
    num_prefilled_tokens: int = 0     # prompt tokens this engine computed KV for
    num_imported_tokens: int = 0      # tokens whose KV arrived from elsewhere
    num_reused_tokens: int = 0        # tokens whose KV came from a cached session
    num_generated_tokens: int = 0
    num_steps: int = 0


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (choose from {', '.join(DTYPES)})")
    return DTYPES[name]
