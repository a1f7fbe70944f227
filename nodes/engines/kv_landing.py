"""Received KV decoded on the destination's device, chunk by chunk as chunks arrive.

Contract: `DeviceLanding(host)` is what `TorchQuantizer.decode` hands a verified chunk to when the
destination lives on a GPU (or when the quantizer is told to take this path on the CPU, for tests).
`decode(payload, info, spec, mode, scale_dtype, target)` stages each payload frame in pinned host
memory, copies it to the device on the landing's own stream and decodes it there: `int8` with
float16 params by nodes/engines/kv_device.py (the reference's values, bit for bit), `raw` and
`bf16` by a copy (converted as `copy_` converts). Float32 params and `int8_sym` are decoded by
the host quantizer's numpy reference (`host.numpy`) into a staging tensor and copied over.
`synchronize()` returns once every chunk handed over so far has landed: the KV thread calls it
before a transfer counts as received, so the engine never reads a half-landed destination.
`decode_by_reference(...)` is that float32 route, shared with the host path (kv_quant.py).
`copy_pieces(pieces, dst, token_offset)` writes a raw transfer's verified frames into a slot of the
engine's cache (any dtype and device), straight from the received frames.

Why a pinned staging copy: the payload is a ZeroMQ frame in pageable memory; from there a copy to
the device is synchronous and staged by the driver. Torch's pinned host allocator reuses a staging
block only once the copy that read it has finished, so no ring of buffers is kept here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bus.kv.layout import ChunkSpec, KVInfo
from bus.kv.pieces import RawPieces
from nodes.engines import kv_device
from nodes.engines.kv_device import NAMES_TO_TORCH


class DeviceLanding:
    def __init__(self, host: Any) -> None:
        self.host = host
        self._streams: dict[torch.device, Any] = {}

    def _stream(self, device: torch.device) -> Any:
        if device.type != "cuda":
            return None
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def decode(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str, scale_dtype: str,
               target: torch.Tensor) -> None:
        stream = self._stream(target.device)
        if stream is None:
            self._decode(payload, info, spec, mode, scale_dtype, target)
            return
        target.record_stream(stream)   # a failed receive drops its destination: not reused until this lands
        with torch.cuda.stream(stream):
            self._decode(payload, info, spec, mode, scale_dtype, target)

    def _decode(self, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str, scale_dtype: str,
                target: torch.Tensor) -> None:
        if mode == "int8" and scale_dtype == "f16":
            codes = self._on_device(payload[0], target.device).view(-1, info.head_dim)
            params = self._on_device(payload[1], target.device).view(torch.float16)
            num_rows = spec.num_rows
            kv_device.decode_int8_rows(codes, params[:num_rows], params[num_rows:], target)
        elif mode in ("raw", "bf16"):
            dtype = NAMES_TO_TORCH[info.dtype] if mode == "raw" else torch.bfloat16
            target.copy_(self._on_device(payload[0], target.device).view(dtype).view(target.shape))
        else:   # float32 params (rare) or int8_sym: the host decodes, float32 crosses
            decode_by_reference(self.host.numpy, payload, info, spec, mode, scale_dtype, target)

    @staticmethod
    def _on_device(frame: np.ndarray, device: torch.device) -> torch.Tensor:
        source = torch.from_numpy(np.asarray(frame).view(np.uint8).reshape(-1))
        if device.type != "cuda":
            return source
        staged = torch.empty(source.shape, dtype=torch.uint8, pin_memory=True)
        staged.copy_(source)
        return staged.to(device, non_blocking=True)

    def synchronize(self) -> None:
        for stream in self._streams.values():
            stream.synchronize()


def decode_by_reference(reference: Any, payload: list[np.ndarray], info: KVInfo, spec: ChunkSpec, mode: str,
                        scale_dtype: str, target: torch.Tensor) -> None:
    """A chunk decoded by the numpy reference (`NumpyQuantizer`) into float32, then copied into
    `target` (any dtype, any device): for what the fast paths do not take."""
    staging = np.empty(tuple(target.shape), np.float32)
    reference._decode_f32(payload, info, spec, mode, scale_dtype, staging)
    target.copy_(torch.from_numpy(staging))


def copy_pieces(pieces: RawPieces, dst: torch.Tensor, token_offset: int = 0) -> None:
    """Write a raw transfer's verified pieces into dst [layers, 2, kv_heads, >= tokens, head_dim] of
    any float dtype and device (converted as copy_ converts), from token `token_offset` of dst on.
    Each layer of dst must hold its (2, kv_heads) planes contiguously, as a slot of the slot cache
    does; a piece is copied layer by layer, straight from the received frame (bus/kv/pieces.py
    says why)."""
    info = pieces.info
    per_layer = 2 * info.shape[2]
    for spec, values in pieces.pieces():
        source = torch.from_numpy(values.view(np.uint8)).view(NAMES_TO_TORCH[info.dtype])   # as decode() views payloads
        plane = spec.plane_start
        while plane < spec.plane_stop:
            layer, first = divmod(plane, per_layer)
            stop = min(spec.plane_stop, (layer + 1) * per_layer)
            planes = dst[layer].view(per_layer, dst.shape[3], dst.shape[4])
            tokens = slice(spec.tokens.start + token_offset, spec.tokens.stop + token_offset)
            planes[first:first + stop - plane, tokens].copy_(source[plane - spec.plane_start:stop - spec.plane_start])
            plane = stop
