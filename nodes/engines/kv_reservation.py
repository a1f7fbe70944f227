"""Reserving a decode engine's KV slot store up front, or saying clearly why it cannot be.

Contract: `reserve_slot_store(slots, num_tokens, config, device)` faults in the slot store for
`num_tokens` (`[decode] preallocate_kv`): no request then waits for memory, neither the first one
nor the one that grows the batch (kv_slots.py). It raises `KVMemoryError`, before touching any of
it, when the budget exceeds MAX_MEMORY_SHARE of the memory available (faulting it in would end in
the kernel's OOM killer, not in an error), and the same error when the allocator refuses (torch's
OutOfMemoryError on a GPU). With preallocation off, or the store already that large, it does
nothing (`pdbus decode` reserves before DecodeWork.prepare, so a second call is common).
"""

from __future__ import annotations

import torch

from nodes.engines import hugepages
from nodes.engines.engine_types import EngineConfig
from nodes.engines.kv_slots import SlotCache

MAX_MEMORY_SHARE = 0.9   # of MemAvailable a KV reservation may take: the other processes need some


class KVMemoryError(ValueError):
    """The configured KV budget cannot be reserved in this machine's memory."""


def reserve_slot_store(slots: SlotCache, num_tokens: int, config: EngineConfig, device: torch.device) -> None:
    num_bytes = slots.num_bytes_for(num_tokens) - slots.num_bytes
    if not config.preallocate_kv or num_bytes <= 0:   # off, or reserved already: nothing to do
        return
    available = hugepages.available_bytes() if device.type == "cpu" else None
    if available is not None and num_bytes > MAX_MEMORY_SHARE * available:
        raise _memory_error(config, num_bytes, f"only {available / 2**30:.2f} GiB of memory is available")
    try:
        slots.reserve(num_tokens)
    except RuntimeError as exc:   # the allocator's refusal (torch.OutOfMemoryError on a GPU)
        raise _memory_error(config, num_bytes, f"allocating it failed ({str(exc).splitlines()[0]})") from None


def _memory_error(config: EngineConfig, num_bytes: int, why: str) -> KVMemoryError:
    return KVMemoryError(
        f"the KV budget ([decode] num_kv_blocks = {config.num_kv_blocks} x block_size {config.block_size} tokens) "
        f"needs {num_bytes / 2**30:.2f} GiB, but {why}: lower num_kv_blocks, or set "
        "[decode] preallocate_kv = false to allocate it on demand")
