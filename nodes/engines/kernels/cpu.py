"""The one probe of what this CPU and this process can run: taken once, logged by every node at start.

Contract: `probe()` returns a frozen `CpuFeatures`, the same object for the life of the process:
- `numba`: numba and llvmlite import, and `PDBUS_NO_NUMBA` is unset. Every kernel needs it; without
  it torch serves every operation (kernels.dispatch).
- `avx512f`, `avx512bf16`, `amx`: what LLVM reports of the host CPU (the features the kernels are
  compiled for), after the masks; all false without numba (llvmlite is then never imported). `amx` also needs Linux to grant this process the tile data state
  (arch_prctl ARCH_REQ_XCOMP_PERM, what oneDNN asks for too); the probe asks once.
- `host_amx`: the CPU has AMX, masks ignored. Choices that change rounding (decode attention's
  value products) follow the CPU, not a mask, so two processes on one machine round alike.
- `onednn_amx`, `onednn_bf16`: whether torch's oneDNN multiplies bf16 on AMX tiles, or in hardware at
  all (AMX or AVX512-BF16), as torch detects it under `ONEDNN_MAX_CPU_ISA`; `auto` dtype follows it.
  `onednn_amx()` and `onednn_bf16()` answer these two alone (`onednn_on_tiles()`: whether oneDNN
  is on tiles in fact, the mask aside), importing neither numba nor llvmlite
  (vLLM's start-up fails in a process that has loaded llvmlite, and engine_common serves vLLM too).
`as_log()` is the dict a node logs as `cpu_features`.

Masks: `PDBUS_NO_NUMBA`, `PDBUS_NO_AVX512BF16` and `PDBUS_NO_AMX`, set to anything but "" or "0",
make the process act as on a CPU (or install) without that feature. The suite runs the engine
under each (tests/nodes/engines/kernels/test_cpu_paths.py), so which kernels CI tests does not
depend on the runner's CPU. A mask is read at the first `probe()`; set it before the process starts.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import asdict, dataclass

MASKS = ("PDBUS_NO_NUMBA", "PDBUS_NO_AVX512BF16", "PDBUS_NO_AMX")
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    numba: bool
    avx512f: bool
    avx512bf16: bool
    amx: bool
    host_amx: bool
    onednn_amx: bool
    onednn_bf16: bool
    masked: tuple[str, ...]

    def as_log(self) -> dict[str, object]:
        return asdict(self)


def masked(name: str) -> bool:
    """Whether the mask `name` (one of MASKS) is set."""
    return os.environ.get(name, "") not in ("", "0")


@functools.cache
def probe() -> CpuFeatures:
    numba = not masked("PDBUS_NO_NUMBA") and _numba_imports()
    host = _host_features() if numba else {}   # PDBUS_NO_NUMBA: llvmlite is never loaded either
    host_amx = (bool(host.get("amx-tile")) and bool(host.get("amx-bf16"))) if numba else _torch_probe(
        "_is_amx_tile_supported")
    avx512bf16 = bool(host.get("avx512bf16")) and not masked("PDBUS_NO_AVX512BF16")
    amx = numba and host_amx and not masked("PDBUS_NO_AMX") and _request_tile_state()
    return CpuFeatures(
        numba=numba, avx512f=bool(host.get("avx512f")), avx512bf16=numba and avx512bf16, amx=amx,
        host_amx=host_amx, onednn_amx=onednn_amx(), onednn_bf16=onednn_bf16(),
        masked=tuple(name for name in MASKS if masked(name)))


def onednn_amx() -> bool:
    """oneDNN multiplies bf16 on AMX tiles (torch's probe, under the cap and the mask)."""
    return not masked("PDBUS_NO_AMX") and onednn_on_tiles()


def onednn_on_tiles() -> bool:
    """oneDNN does multiply bf16 on AMX tiles, whatever pdbus's mask says (only the cap,
    `ONEDNN_MAX_CPU_ISA`, keeps oneDNN off them): what its rounding follows."""
    return onednn_may_use("AMX") and _torch_probe("_is_amx_tile_supported")


def onednn_bf16() -> bool:
    """oneDNN multiplies bf16 in hardware: AMX tiles or AVX512-BF16 (else it emulates bf16)."""
    return onednn_amx() or (onednn_may_use("BF16") and _torch_probe("_is_avx512_bf16_supported"))


def onednn_may_use(feature: str) -> bool:
    """Whether `ONEDNN_MAX_CPU_ISA` (unset: no cap) lets oneDNN use AMX, or bf16 instructions.
    torch's probes report the CPU, not that cap."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in ("", "ALL", "DEFAULT"):
        return True
    if feature == "AMX":
        return "AMX" in cap
    return "AMX" in cap or "BF16" in cap or "FP16" in cap or cap.startswith("AVX10")


def _numba_imports() -> bool:
    try:
        import llvmlite.binding  # noqa: F401
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _host_features() -> dict[str, bool]:
    try:
        from llvmlite import binding
    except ImportError:   # no kernels can run; torch's own probes still answer for oneDNN
        return {}
    return {name: bool(value) for name, value in binding.get_host_cpu_features().items()}


def _torch_probe(name: str) -> bool:
    import torch
    check = getattr(torch.cpu, name, None)
    return bool(check and check())


def _request_tile_state() -> bool:
    """Linux hands out the 8 KB tile register state only to processes that ask (kernel >= 5.16)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0)
    except (OSError, AttributeError):
        return False
