"""Large CPU tensors on transparent huge pages, where the kernel lets a process ask for them.

Contract: `empty(shape, dtype)` is `torch.empty` on the CPU, except that on Linux an allocation of
at least `MIN_BYTES` is advised MADV_HUGEPAGE before anything touches it, so its pages fault in as
2 MiB pages when the system's THP mode is `madvise` (the default on many distributions, and on
these machines) or `always`. `Arena(shapes, dtype)` hands out consecutive views of one such
allocation, for tensors each too small to fill a huge page. `available_bytes()` is the kernel's
MemAvailable. Nothing here fails: where the advice
is not available or refused, the memory is ordinary pages.

Why: a decode step streams the KV cache and the weights once each, and on 4 KiB pages the TLB
misses of that stream cost a visible share of it (numpy arrays already get the advice from numpy;
torch's allocations do not). `make bench-engine` measures whole steps.
"""

from __future__ import annotations

import ctypes
import math
import sys

import torch

MIN_BYTES = 4 << 20          # below this, at most one huge page could be had: not worth asking
_PAGE = 4096
_MADV_HUGEPAGE = 14          # linux/mman.h


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def advise(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under `tensor`'s memory (whole 4 KiB pages inside it); True if accepted."""
    num_bytes = tensor.numel() * tensor.element_size()
    if _LIBC is None or tensor.device.type != "cpu" or num_bytes < MIN_BYTES:
        return False
    start = -(-tensor.data_ptr() // _PAGE) * _PAGE
    end = (tensor.data_ptr() + num_bytes) // _PAGE * _PAGE
    return end > start and _LIBC.madvise(start, end - start, _MADV_HUGEPAGE) == 0


def available_bytes() -> int | None:
    """The kernel's estimate of memory available to a new allocation (MemAvailable), None where it
    cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.empty on the CPU, advised onto huge pages before its first touch."""
    tensor = torch.empty(shape, dtype=dtype)
    advise(tensor)
    return tensor


class Arena:
    """Room for tensors of the given shapes, carved in order out of one advised allocation (each
    starts 64-byte aligned)."""

    _ALIGN = 64

    def __init__(self, shapes: list[tuple[int, ...]], dtype: torch.dtype) -> None:
        self._step = max(1, self._ALIGN // torch.empty(0, dtype=dtype).element_size())
        num_elements = sum(self._padded(math.prod(shape)) for shape in shapes)
        self._buffer = empty((num_elements + self._step,), dtype)
        self._offset = (-(self._buffer.data_ptr() // self._buffer.element_size())) % self._step

    def _padded(self, num_elements: int) -> int:
        return -(-num_elements // self._step) * self._step

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of `tensor` in the arena (same shape and values, contiguous)."""
        n = tensor.numel()
        if self._offset + n > self._buffer.numel():
            raise ValueError(f"the arena is full: {n} more elements do not fit")
        view = self._buffer[self._offset:self._offset + n].view(tensor.shape)
        view.copy_(tensor)
        self._offset += self._padded(n)
        return view
