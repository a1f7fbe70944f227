"""A receive destination for `raw` transfers that copies nothing: verified chunks stay where they arrived.

Contract: `RawPieces(info)` stands where an allocator would return a dense buffer, for a transfer
whose chunks are `raw` (chunk_codec.decode refuses any other mode into it, so such a transfer fails
closed). `keep(spec, payload)` records one verified chunk: its payload frame (read-only bytes of
the source dtype, usually the received ZeroMQ frame itself) and the plane x token range it covers.
Readers: `shape` / `dtype` / `num_tokens` (as a dense KV of `info` would have), `pieces()` yields
`(spec, array)` with the array viewed as (planes, tokens, head_dim) of the source's numpy storage
dtype (bfloat16 as uint16 bits), `copy_into(dst)` writes them into a numpy array shaped like the KV
(`to_numpy()` into a new one), and `release()` drops the frames (the memory goes back to ZeroMQ's
allocator). A RawPieces is only complete once its transfer's result is ok; the receiver never hands
out an incomplete one.

Why: a raw chunk's payload already is the engine's bytes. Copying it into a receive buffer and then
again into the engine's slot cache touched every byte twice on the decode node, which shares its
cores with the decode steps; now the engine's import is the only copy (nodes/engines/kv_slots.py
writes pieces into a slot). `make bench-kv`'s end-to-end raw rows take this path, and its
"Destination" table times the receiver's side of it against a copy into a pooled buffer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from bus.kv.kv_errors import KVValueError
from bus.kv.layout import DTYPES, ChunkSpec, KVInfo, as_planes


class RawPieces:
    def __init__(self, info: KVInfo) -> None:
        self.info = info
        self._pieces: list[tuple[ChunkSpec, Any]] = []

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def dtype(self) -> str:
        return self.info.dtype

    @property
    def num_tokens(self) -> int:
        return self.info.num_tokens

    @property
    def num_pieces(self) -> int:
        return len(self._pieces)

    def keep(self, spec: ChunkSpec, payload: Any) -> None:
        num_bytes, expected = len(memoryview(payload).cast("B")), spec.num_rows * self.info.head_dim * self.info.itemsize
        if num_bytes != expected:
            raise KVValueError(f"raw chunk {spec.index} holds {num_bytes} bytes, its range needs {expected}")
        self._pieces.append((spec, payload))

    def pieces(self) -> Iterator[tuple[ChunkSpec, np.ndarray]]:
        storage = DTYPES[self.info.dtype]
        for spec, payload in self._pieces:
            shape = (spec.plane_stop - spec.plane_start, spec.token_stop - spec.token_start, self.info.head_dim)
            yield spec, np.frombuffer(payload, np.uint8).view(storage).reshape(shape)

    def copy_into(self, dst: np.ndarray) -> np.ndarray:
        if tuple(dst.shape) != self.info.shape or dst.dtype != DTYPES[self.info.dtype]:
            raise KVValueError(f"destination {dst.shape} {dst.dtype} is not a {self.info.shape} "
                               f"{self.info.dtype} KV")
        planes = as_planes(dst, self.info)
        for spec, values in self.pieces():
            planes[spec.planes, spec.tokens] = values
        return dst

    def to_numpy(self) -> np.ndarray:
        return self.copy_into(np.empty(self.info.shape, DTYPES[self.info.dtype]))

    def release(self) -> None:
        self._pieces.clear()

    def __repr__(self) -> str:
        return f"RawPieces({self.info.shape}, {self.info.dtype}, {len(self._pieces)} pieces)"
