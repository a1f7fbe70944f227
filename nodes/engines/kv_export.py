"""What leaves a prefill engine: a prompt's KV, as a CPU tensor or encoded on the device as it is made.

Contract:
- `exported_kv(kv)`: the prompt's KV tensor as the engine contract hands it out by default, on the
  CPU (a GPU engine copies it out once, into pinned memory).
- `DeviceExport(kv, mode)`: with `EngineConfig.kv_export` set to a wire mode (`int8`, `bf16`,
  `raw`), the prefill pass calls `layer_done(layer, start, stop)` as each layer's KV of tokens
  [start, stop) is final on the device (every chunk of a chunked prefill; a cached prefix, copied
  in before, rides with the rest). Once a layer's last span is told, its rows are encoded on the
  device (nodes/engines/kv_device.py) and copied into pinned host buffers laid out as the KV
  (layers, 2, kv_heads, tokens, ...), on a side stream, so the copy of layer l runs while layer
  l+1 computes; an event per layer says when it has landed. The sender reads it through the
  quantizer (`encode`, byte for byte the payload bus/kv/quant.py's reference makes), waiting only
  for the layers of the chunk it sends: a transfer may start as soon as the export exists
  (`Engine.on_kv_export`) and its chunks leave while later layers compute. The KV sender asks
  `ready(spec)` first and, until then, waits on its loop for `when_ready(spec, callback)`, so a
  send waiting for the pass never blocks the other transfers of its thread; `encode` then waits
  only for the layer's copy to the host to finish. `cancel(reason)` fails a sender waiting for
  layers a pass will not compute any more (a cancelled prompt, a failed pass); a caller of
  `encode` that did not ask `ready` first waits there, for `EXPORT_WAIT_S` at most. Rows the
  device cannot encode for the wire (non-finite values, a range beyond float16) are encoded by
  the reference from the device KV (copied to the host once), which the export holds until it is
  dropped. On a CPU the same code runs without streams: a layer has landed when `layer_done`
  returns.
- `new_export(engine, request_id, kv)`: what the prefill pass calls as a prompt's export tensor is
  allocated (through `LlamaRunner.new_export`).
- `kv_tail(kv, offset)`: tokens [offset, ...) of either kind, for a decode node that holds the head.

Only `int8` (the default) is quantized on the device; `int8_sym` keeps the CPU codec.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bus.kv.kv_errors import KVValueError
from bus.kv.layout import ChunkSpec, KVInfo
from bus.kv.quant import EncodedPayload, NumpyQuantizer
from nodes.engines import kv_device
from nodes.engines.engine_types import DEVICE_KV_MODES

EXPORT_WAIT_S = 120.0   # `encode` waits this long for layers the pass has not computed yet


def exported_kv(kv: torch.Tensor) -> torch.Tensor:
    """The prompt's KV as the engine contract hands it out: on the CPU. A GPU engine copies it out
    once here (the KV codec and the nodes read host memory; the device copy is freed with the pass),
    into pinned memory, which the copy needs no staging buffer for and which torch's host allocator
    hands out again once an export already sent is freed."""
    if kv.device.type == "cpu":
        return kv
    return torch.empty(kv.shape, dtype=kv.dtype, pin_memory=True).copy_(kv)


class DeviceExport:
    """One prompt's KV, encoded for the wire on its device layer by layer (module docstring)."""

    def __init__(self, kv: torch.Tensor, mode: str) -> None:
        if mode not in DEVICE_KV_MODES:
            raise KVValueError(f"the device encodes {', '.join(DEVICE_KV_MODES)}, not {mode!r}")
        self.kv, self.mode = kv, mode
        self.info = KVInfo(tuple(kv.shape), kv_device.TORCH_DTYPES[kv.dtype])  # type: ignore[arg-type]
        layers, _, heads, tokens, head_dim = kv.shape
        pin = kv.device.type == "cuda"
        self.stream = torch.cuda.Stream(kv.device) if pin else None
        if self.stream is not None:
            kv.record_stream(self.stream)   # read there; the export holds kv until it is dropped
        if mode == "int8":
            self.codes = torch.empty(kv.shape, dtype=torch.uint8, pin_memory=pin)
            self.lo = torch.empty(kv.shape[:4], dtype=torch.float16, pin_memory=pin)
            self.hi = torch.empty(kv.shape[:4], dtype=torch.float16, pin_memory=pin)
            self.fits = torch.ones(layers, dtype=torch.bool, pin_memory=pin)
        else:
            self.values = torch.empty(kv.shape, dtype=kv.dtype if mode == "raw" else torch.bfloat16, pin_memory=pin)
        self.events: list[Any] = [None] * layers
        self._complete = [False] * layers   # every token's rows of the layer are on their way
        self._lock = threading.Lock()
        self.cancelled = ""
        self._host_kv: np.ndarray | None = None   # the KV on the host, once a chunk needs the reference
        self._waiters: list[tuple[range, Callable[[], None]]] = []   # told once their layers are ready

    def _kv_for_reference(self) -> np.ndarray:
        """The KV on the host for the reference encoder, copied out once: a layer that does not fit
        sends every chunk of it this way, and each would otherwise copy the whole KV again."""
        if self._host_kv is None:
            self._host_kv = kv_device.host_numpy(self.kv.cpu())
        return self._host_kv

    @property
    def shape(self) -> torch.Size:
        return self.kv.shape

    def layer_done(self, layer: int, start: int, stop: int) -> None:
        """Tokens [start, stop) of `layer` are final on the device. Spans come in order; a layer is
        encoded whole once its last span is told: the wire's chunks hold whole planes (every token
        of a head), so nothing of a layer could leave before then, and one copy a layer beats one
        per plane and span (thousands of copies for a long prompt in 256-token chunks)."""
        if stop < self.info.num_tokens:
            return
        if self.stream is None:
            self._encode_layer(layer)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.kv.device))
            with torch.cuda.stream(self.stream):
                self._encode_layer(layer)
                event = torch.cuda.Event()
                event.record(self.stream)
            self.events[layer] = event
        with self._lock:
            self._complete[layer] = True
        self._wake_waiters()

    def cancel(self, reason: str) -> None:
        """The pass will not finish this prompt: a sender waiting for its layers fails now."""
        with self._lock:
            self.cancelled = reason
        self._wake_waiters()

    def ready(self, spec: ChunkSpec) -> bool:
        """Whether the chunk's layers are computed (or the export cancelled: `encode` then raises)."""
        with self._lock:
            return self._ready(self._layers_of(spec))

    def when_ready(self, spec: ChunkSpec, callback: Callable[[], None]) -> None:
        """`callback()` once `ready(spec)`: at once if it is, else from the thread that tells the
        chunk's last layer done (or cancels)."""
        self._when_layers_ready(self._layers_of(spec), callback)

    def _ready(self, layers: range) -> bool:   # under the lock
        return bool(self.cancelled) or all(self._complete[layers.start:layers.stop])

    def _when_layers_ready(self, layers: range, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._ready(layers):
                self._waiters.append((layers, callback))
                return
        callback()

    def _wake_waiters(self) -> None:
        due: list[tuple[range, Callable[[], None]]] = []
        waiting: list[tuple[range, Callable[[], None]]] = []
        with self._lock:
            for layers, callback in self._waiters:
                (due if self._ready(layers) else waiting).append((layers, callback))
            self._waiters = waiting
        for _, callback in due:   # outside the lock: a callback may ask `ready`
            callback()

    def _encode_layer(self, layer: int) -> None:
        planes = self.kv[layer]   # (2, kv_heads, tokens, head_dim), contiguous
        if self.mode != "int8":
            encoded = planes.to(torch.bfloat16) if self.mode == "bf16" else planes
            self.values[layer].copy_(encoded, non_blocking=True)
            return
        rows = planes.view(-1, self.info.head_dim)
        codes = torch.empty(rows.shape, dtype=torch.uint8, device=rows.device)
        lo = torch.empty(rows.shape[0], dtype=torch.float16, device=rows.device)
        hi = torch.empty_like(lo)
        fits = kv_device.encode_int8_rows(rows, codes, lo, hi)
        self.fits[layer:layer + 1].copy_(fits.view(1), non_blocking=True)
        self.codes[layer].copy_(codes.view(planes.shape), non_blocking=True)
        self.lo[layer].copy_(lo.view(planes.shape[:3]), non_blocking=True)
        self.hi[layer].copy_(hi.view(planes.shape[:3]), non_blocking=True)

    def wait(self, layers: range, timeout: float = EXPORT_WAIT_S) -> None:
        """Return once `layers` have landed on the host; raises KVValueError when the export was
        cancelled or a layer is not computed within `timeout`."""
        told = threading.Event()
        self._when_layers_ready(layers, told.set)
        if not told.wait(timeout):
            raise KVValueError(f"layers {layers.start}..{layers.stop - 1} of the KV were not computed within "
                               f"{timeout:.0f} s")
        with self._lock:
            if not all(self._complete[layers.start:layers.stop]):
                raise KVValueError(f"the prompt's KV will not be computed: {self.cancelled}")
        for layer in layers:
            event = self.events[layer]
            if event is not None:
                event.synchronize()

    def _layers_of(self, spec: ChunkSpec) -> range:
        per_layer = 2 * self.info.shape[2]
        return range(spec.plane_start // per_layer, (spec.plane_stop - 1) // per_layer + 1)

    def encode(self, spec: ChunkSpec, mode: str, outs: list[np.ndarray], reference: NumpyQuantizer) -> EncodedPayload:
        """The chunk's payload in `mode` (the mode it was exported in), as bus.kv.quant's encoders."""
        if mode != self.mode:
            raise KVValueError(f"this KV was encoded on the device for {self.mode!r}, not {mode!r}")
        layers = self._layers_of(spec)
        self.wait(layers)
        info = self.info
        if mode != "int8":
            chunk = self.values.view(info.num_planes, info.num_tokens, info.head_dim)[spec.planes, spec.tokens]
            return EncodedPayload([_bytes_of(chunk, outs[0])])
        if not bool(self.fits[layers.start:layers.stop].all()):
            return reference.encode(self._kv_for_reference(), info, spec, mode, outs)
        codes = self.codes.view(info.num_planes, info.num_tokens, info.head_dim)[spec.planes, spec.tokens]
        num_rows = spec.num_rows
        params = outs[1][: num_rows * 4].view(np.float16)
        params[:num_rows] = self.lo.view(info.num_planes, info.num_tokens)[spec.planes, spec.tokens].reshape(-1).numpy()
        params[num_rows:] = self.hi.view(info.num_planes, info.num_tokens)[spec.planes, spec.tokens].reshape(-1).numpy()
        return EncodedPayload([_bytes_of(codes, outs[0]), outs[1][: num_rows * 4]], "f16")

    def tail(self, offset: int) -> DeviceExport:
        """Tokens [offset, ...), encoded again on the device from its KV (int8 rows are per token:
        the same bytes as those tokens' rows here). Taken once the pass has computed every layer."""
        kv = self.kv[:, :, :, offset:].contiguous()
        tail = DeviceExport(kv, self.mode)
        for layer in range(kv.shape[0]):
            tail.layer_done(layer, 0, kv.shape[3])
        return tail


def new_export(engine: Any, request_id: str, kv: torch.Tensor) -> DeviceExport | None:
    """A prompt's DeviceExport over its export tensor `kv` when the engine's `config.kv_export`
    names a mode (else None), told to the engine's `on_kv_export` (a prefill node may start the
    transfer now, before the pass ends)."""
    if not engine.config.kv_export:
        return None
    export = DeviceExport(kv, engine.config.kv_export)
    if engine.on_kv_export is not None:
        engine.on_kv_export(request_id, export)
    return export


def kv_tail(kv: Any, offset: int) -> Any:
    """Tokens [offset, ...) of an exported KV (a tensor or a DeviceExport)."""
    if isinstance(kv, DeviceExport):
        return kv.tail(offset)
    return kv[:, :, :, offset:].contiguous()


def _bytes_of(chunk: torch.Tensor, out: np.ndarray) -> np.ndarray:
    """The chunk's bytes: a view when contiguous, else copied into `out`."""
    if not chunk.is_contiguous():
        staged = torch.from_numpy(out[: chunk.numel() * chunk.element_size()]).view(chunk.dtype).view(chunk.shape)
        staged.copy_(chunk)
        chunk = staged
    return kv_device.host_bytes(chunk)
