"""A pool of reusable KV buffers: where a decode node receives transferred KV.

Contract: `KVBufferPool(max_free=4)`; `take(shape, dtype)` returns a contiguous CPU tensor of
exactly `shape` viewed over a pooled flat buffer (the smallest free one that holds it and is at
most twice its size, else a new one); `give(tensor)` hands it back once nothing reads it any
more. `give` of a tensor not taken here, or given back already, does nothing. At most `max_free`
buffers wait for reuse (the oldest go first). Thread-safe: the KV thread takes and hands back
failed receives, the node's thread hands back what the engine has copied.
`drop_free(keep_bytes=0)` lets go of the waiting buffers but the last one given back, which it
keeps if it is at most `keep_bytes` (the node calls it when it goes quiet, before it trims its
heap: an idle node gives its memory back, but for the one buffer that the next request of a
sequential client will want), and returns how many bytes it let go. `num_free_bytes` is what the
waiting buffers take; `num_free` / `num_taken` / `num_allocated` count buffers, for tests and logs.

Why: glibc serves allocations above its mmap threshold with fresh pages (a decode node sets that
threshold to 4 MiB, nodes/heap.py; glibc's own default rises to at most 32 MiB), and writing into
fresh pages runs at ~8 GB/s here against ~27 into reused ones (issue 3's measurement). The KV of
a 1024-token prompt is 45 MiB in float32, 22.5 MiB in bf16: verifying and decoding an int8
transfer of the float32 one took 30-31 ms into a new tensor and 3.5-3.7 ms into a reused one
(`make bench-kv`'s "Destination" table measures both side by side). A node serving one request at
a time goes quiet between any two, so dropping every buffer then made each request pay that.
"""

from __future__ import annotations

import math
import threading
from collections import deque

import torch

ALIGN_ELEMENTS = 1 << 18   # buffers grow in steps of 256 Ki elements (1 MiB in float32)


def _num_bytes(buffer: torch.Tensor) -> int:
    return buffer.numel() * buffer.element_size()


class KVBufferPool:
    def __init__(self, max_free: int = 4) -> None:
        self.max_free = max_free
        self._free: deque[torch.Tensor] = deque()
        self._taken: dict[int, torch.Tensor] = {}    # data_ptr -> its flat buffer
        self._lock = threading.Lock()
        self.num_allocated = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_taken(self) -> int:
        return len(self._taken)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        need = math.prod(shape)
        with self._lock:
            buffer = self._best_fit(need, dtype)
            if buffer is None:
                buffer = torch.empty(-(-need // ALIGN_ELEMENTS) * ALIGN_ELEMENTS, dtype=dtype)
                self.num_allocated += 1
            self._taken[buffer.data_ptr()] = buffer
        return buffer[:need].view(shape)

    def give(self, tensor: torch.Tensor | None) -> None:
        if tensor is None:
            return
        with self._lock:
            buffer = self._taken.pop(tensor.data_ptr(), None)
            if buffer is None:
                return
            self._free.append(buffer)
            while len(self._free) > self.max_free:
                self._free.popleft()

    @property
    def num_free_bytes(self) -> int:
        with self._lock:
            return sum(map(_num_bytes, self._free))

    def drop_free(self, keep_bytes: int = 0) -> int:
        with self._lock:
            dropped = list(self._free)
            if dropped and _num_bytes(dropped[-1]) <= keep_bytes:
                self._free = deque([dropped.pop()])
            else:
                self._free = deque()
        return sum(map(_num_bytes, dropped))

    def _best_fit(self, need: int, dtype: torch.dtype) -> torch.Tensor | None:
        fits = [i for i, b in enumerate(self._free) if b.dtype == dtype and need <= b.numel() <= 2 * need + ALIGN_ELEMENTS]
        if not fits:
            return None
        best = min(fits, key=lambda i: self._free[i].numel())
        buffer = self._free[best]
        del self._free[best]   # by position: deque.remove would compare tensors elementwise
        return buffer
