"""Which implementation serves each operation: decided here, once per runner, and nowhere else.

Contract: `plan(dtype, device, use_kernels=True)` returns a frozen `KernelPlan` for a runner of
that dtype ("bfloat16" or "float32") on that device. Each field names the implementation of one
operation (docs/KERNELS.md has the table); "torch" means torch's own path (oneDNN, MKL, SDPA):
- `linear`: "amx" (kernels.linear.amx), "dot_bf16" (linear.dot_bf16), "dot_f32" (linear.dot_f32)
  or "torch"; the kernel serves steps of at most `linear_max_rows` rows, torch the larger ones.
- `decode_attention`: "bf16" or "f32" (kernels.decode_attention) for pure decode steps, or "torch".
- `prefill_attention`: "amx_tiles" or "soft_tiles" (kernels.prefill_attention.tiled), or "torch".
- `norm_rope`: "bf16" (kernels.norm_rope, RMSNorm, RoPE and the KV writes of any step), or "torch".
- `kv_int8`: "numba" (kernels.kv_int8) or "torch" (compiled torch; nodes.engines.kv_quant).
- `attention_prefetch`: whether the decode attention kernel requests K/V lines ahead (timed at
  start-up: it pays on some CPUs and costs on others; it changes no result).
A kernel is chosen where `kernels.cpu.probe()` says the CPU and process can run it and its warm-up
compiles (a compiler that fails leaves the next choice down); off the CPU, or with
`use_kernels=False`, torch serves everything. `as_log()` is what a node logs as `kernels`.

Rounding: in bf16 the kernels round where torch's path rounds, but sum in another order; a
prefill node and the decode node that recovers its request after a failover must take the same
choices, so the choices depend on the CPU's features (never on a timing) and `prefill_attention`
serves every prefill span whatever else shares its step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass

from nodes.engines.kernels.cpu import probe

DOT_MAX_ROWS = 32        # vdpbf16ps / AVX-512 outer products, and AMX tiles
HEAD_DIM = 64            # the tiled prefill attention's head size


@dataclass(frozen=True, slots=True)
class KernelPlan:
    linear: str = "torch"
    linear_max_rows: int = 0
    decode_attention: str = "torch"
    prefill_attention: str = "torch"
    norm_rope: str = "torch"
    kv_int8: str = "torch"
    attention_prefetch: bool = False

    @property
    def fast_bf16(self) -> bool:
        """Whether the bf16 fast path (kernels.fast_path) serves: decode attention, norms and RoPE,
        and the linear layers where `linear` is a bf16 kernel."""
        return self.decode_attention == "bf16"

    def as_log(self) -> dict[str, object]:
        return asdict(self)


TORCH = KernelPlan()


def plan(dtype: str, device: str = "cpu", use_kernels: bool = True) -> KernelPlan:
    if not use_kernels or not str(device).startswith("cpu") or not probe().numba:
        return TORCH
    if dtype == "bfloat16":
        return _bf16_plan()
    if dtype == "float32":
        return _f32_plan()
    return KernelPlan(kv_int8=kv_int8_backend())


@functools.cache
def kv_int8_backend() -> str:
    from nodes.engines.kernels.kv_int8 import decode, encode
    return "numba" if encode.AVAILABLE and compiles(encode.warmup, decode.warmup) else "torch"


@functools.cache
def _bf16_plan() -> KernelPlan:
    from nodes.engines.kernels.decode_attention import bf16 as decode_bf16
    from nodes.engines.kernels.norm_rope import bf16 as norm_bf16
    if not compiles(decode_bf16.warmup, norm_bf16.warmup):
        return KernelPlan(kv_int8=kv_int8_backend())
    linear, rows = _bf16_linear()
    return KernelPlan(linear=linear, linear_max_rows=rows, decode_attention="bf16",
                      prefill_attention=_prefill_attention(linear), norm_rope="bf16",
                      kv_int8=kv_int8_backend(), attention_prefetch=decode_bf16.prefetch_pays())


def _bf16_linear() -> tuple[str, int]:
    from nodes.engines.kernels import amx_tiles
    from nodes.engines.kernels.linear import amx, dot_bf16
    if amx_tiles.AVAILABLE and compiles(amx.warmup):
        return "amx", amx_tiles.MAX_ROWS
    if dot_bf16.AVAILABLE and compiles(dot_bf16.warmup):
        return "dot_bf16", DOT_MAX_ROWS
    return "torch", 0


def _prefill_attention(linear: str) -> str:
    """AMX tiles where the linear layers run on them; their AVX512-BF16 emulation on CPUs without
    AMX. An AMX CPU whose AMX kernels failed to compile gets torch's SDPA, not the emulation: the
    emulation's rounding on such a CPU would differ from its peers'."""
    from nodes.engines.kernels.prefill_attention import tiled
    if tiled.TILES is None or not tiled.can_attend(1, 1, HEAD_DIM):
        return "torch"
    if tiled.ON_AMX and linear != "amx":
        return "torch"
    if not compiles(tiled.warmup):
        return "torch"
    return "amx_tiles" if tiled.ON_AMX else "soft_tiles"


@functools.cache
def _f32_plan() -> KernelPlan:
    from nodes.engines.kernels.decode_attention import f32 as decode_f32
    from nodes.engines.kernels.linear import dot_f32
    linear = "dot_f32" if dot_f32.AVAILABLE and compiles(dot_f32.warmup) else "torch"
    attends = compiles(decode_f32.warmup)
    return KernelPlan(linear=linear, linear_max_rows=dot_f32.MAX_ROWS if linear != "torch" else 0,
                      decode_attention="f32" if attends else "torch", kv_int8=kv_int8_backend(),
                      attention_prefetch=attends and decode_f32.prefetch_pays())


def compiles(*warmups: Callable[[], object]) -> bool:
    """Whether each kernel set's warm-up (its compile, or load from the disk cache) succeeds."""
    try:
        for warmup in warmups:
            warmup()
    except Exception:   # a compiler that cannot build them: the next choice down serves
        return False
    return True
