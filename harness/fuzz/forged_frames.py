"""Frames a peer can build: the pure helpers the fuzz strategies and senders share, no sockets.

Contract:
- `Known`: what hostile traffic aims at: real node ids (DIRECT targets), live request and transfer
  ids (lists that may grow while strategies run: they are read at draw time), the decode nodes' KV
  endpoints and the KV geometry of the engine's model (`tiny_geometry()`, read without torch).
- `pack(value)`: msgpack as the bus packs it.
- `kv_header(kind, fields, version=, trailer_ok=)`: a KV header frame over ANY fields (a value, or
  bytes taken as the packed fields) with a valid xxh3_64 trailer unless told: it passes the
  receiver's checksum whatever it says.
- `chunk_fields(...)`, `forged_transfer(transfer_id, request_id, shape, fill)`: a consistent raw
  float32 transfer of `shape` holding `fill` repeated (NaN, infinities, ...), every CHUNK then
  the END, with valid payload checksums, trailers and digest: it passes every check a receiver can
  make without knowing who sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import xxhash

from bus.kv import frames as kvf
from bus.kv.chunk_codec import payload_checksum, transfer_digest
from bus.kv.layout import ChunkSpec, KVInfo, plan_chunks
from bus.kv.quant import payload_sizes


@dataclass
class Known:
    node_ids: list[str] = field(default_factory=lambda: ["decode-0", "prefill-0"])
    request_ids: list[str] = field(default_factory=list)
    transfer_ids: list[str] = field(default_factory=list)
    data_endpoints: list[str] = field(default_factory=list)
    geometry: tuple[int, int, int] = (2, 2, 16)   # layers, kv_heads, head_dim

    def pick(self, name: str, index: int, fallback: str) -> str:
        values = getattr(self, name)
        return values[index % len(values)] if values else fallback


def tiny_geometry() -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of the tiny random model, read without importing torch."""
    from nodes.engines.model_loader import build_tiny_model
    kw = build_tiny_model.__kwdefaults__
    assert kw is not None   # its parameters are keyword-only, with defaults
    return kw["num_layers"], kw["num_kv_heads"], kw["hidden_size"] // kw["num_heads"]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def kv_header(kind: int, fields: Any, version: int = kvf.VERSION, trailer_ok: bool = True) -> bytes:
    """A header frame over `fields` (any value); the xxh3_64 trailer is valid unless told."""
    packed = fields if isinstance(fields, bytes) else pack(fields)
    head = kvf.MAGIC + bytes((version, kind)) + packed
    digest = xxhash.xxh3_64_intdigest(head) ^ (0 if trailer_ok else 1)
    return head + digest.to_bytes(8, "little")


def chunk_fields(transfer_id: str, request_id: str, shape: list, spec: ChunkSpec, num_chunks: int,
                 sizes: list[int], checksum: int) -> list:
    """A consistent raw float32 CHUNK header's fields (uncompressed frames of `sizes`)."""
    return [transfer_id, request_id, shape, "float32", "raw", 0, num_chunks, spec.index, spec.plane_start,
            spec.plane_stop, spec.token_start, spec.token_stop, "", [["none", 0, n, n] for n in sizes], checksum, 0]


def forged_transfer(transfer_id: str, request_id: str, shape: tuple[int, int, int, int, int], fill: bytes,
                    chunk_bytes: int = 4096) -> list[list[bytes]]:
    """Every CHUNK and the END of a consistent raw float32 transfer of `shape` holding `fill`
    repeated (NaN, infinities, ...), with valid payload checksums, trailers and digest: it passes
    every check a receiver can make without knowing who sent it."""
    info = KVInfo(shape, "float32")
    specs = plan_chunks(info, chunk_bytes)
    messages, checksums = [], np.zeros(len(specs), np.uint64)
    for spec in specs:
        sizes = payload_sizes("raw", spec, info)
        payload = [(fill * (n // len(fill) + 1))[:n] for n in sizes]
        checksums[spec.index] = payload_checksum(payload)
        fields = chunk_fields(transfer_id, request_id, list(shape), spec, len(specs), sizes, int(checksums[spec.index]))
        messages.append([kv_header(kvf.CHUNK, fields), *payload])
    end = [transfer_id, request_id, len(specs), info.nbytes, transfer_digest(checksums)]
    return [*messages, [kv_header(kvf.END, end)]]
