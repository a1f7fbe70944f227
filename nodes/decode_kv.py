"""Where a decode node's received KV lands: the `KVReceiver` on the KV thread and the buffers it
writes into (the data-plane half of nodes/decode_node.py).

Contract (`KvLanding(settings, engine, kv_thread, jobs, post)`), by thread:
- KV thread: `allocate(transfer_id, request_id, info, mode) -> dst | None` takes a transfer only
  for a request in `jobs` still waiting for its KV whose prompt and the model's layout match the
  transfer's shape (else the receiver refuses it, `refused.no_destination`), and records the
  transfer id on the job; every finished receive, ok or not, is `post`ed as `KvArrived`.
- node thread: `start() -> data endpoint`, `received_kv(result)` (a verified result's KV, as
  `allocate` gave it), `give_back(kv)` (a buffer nobody will decode from),
  `give_back_arrived(job)`, `cancel(job, reason)` (its receives), `on_idle()`, `num_free_mib()`,
  `close()`.
Received KV lands in reused buffers where the engine copies it on admission (nodes/kv_buffers.py:
fresh pages made a 45 MiB int8 receive 8x slower), or for `raw` in its verified frames
(RawPieces, copied once by the engine); an engine that does not copy gets a new tensor each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from bus.kv import KVReceiver, RawPieces, TransferResult
from bus.kv.layout import DEFAULT_CHUNK_BYTES, KVInfo
from bus.kv.recv_core import ReceiveConfig
from nodes.decode_jobs import DecodeJob, KvArrived
from nodes.engines.base import Engine
from nodes.engines.kv_quant import TorchQuantizer
from nodes.kv_buffers import KVBufferPool
from nodes.loop_thread import LoopThread
from nodes.node_settings import NodeSettings

if TYPE_CHECKING:
    import torch

IDLE_BUFFER_BYTES = 64 << 20   # a quiet node keeps one received-KV buffer up to this size (kv_buffers.py)
# A legitimate chunk carries at most about `[kv] chunk_mib` of payload; prefill nodes may be set
# up apart from this one, so the bound (which also sets the data socket's MAXMSGSIZE) leaves 4x
# and never less than 64 MiB, instead of the 1 GiB the protocol allows.
MIN_CHUNK_BOUND = 64 << 20


def receive_config(settings: NodeSettings) -> ReceiveConfig:
    chunk_bytes = int(settings.kv_chunk_mib * 2**20) if settings.kv_chunk_mib else DEFAULT_CHUNK_BYTES
    return ReceiveConfig(max_chunk_bytes=max(4 * chunk_bytes, MIN_CHUNK_BOUND))


class KvLanding:
    def __init__(self, settings: NodeSettings, engine: Engine, kv_thread: LoopThread, jobs: dict[str, DecodeJob],
                 post: Callable[[Any], None]) -> None:
        self.settings, self.engine, self.kv_thread, self.jobs, self.post = settings, engine, kv_thread, jobs, post
        # [kv] device_codec: int8 and bf16 chunks are decoded on the engine's device as they arrive
        # (nodes/engines/kv_landing.py); on a CPU engine that is the same path, for its tests.
        self.on_device = settings.kv_device_codec
        self.quantizer = TorchQuantizer(compile=settings.kv_compile, on_device=self.on_device)
        self.buffers = KVBufferPool() if engine.copies_imported_kv else None
        self.receiver = KVReceiver(self.allocate, lambda transfer_id, kv: self.give_back(kv),   # failed receives
                                   quantizer=self.quantizer, config=receive_config(settings),
                                   bind=settings.kv_bind,
                                   advertise=settings.kv_advertise, security=settings.security,
                                   on_result=self._on_result)
        self.started = False

    def start(self) -> str:
        if self.settings.kv_compile and self.settings.kv_quant != "raw":
            self.quantizer.warmup()
        self.started = True
        return self.kv_thread.run(self.receiver.start())

    def allocate(self, transfer_id: str, request_id: str, info: KVInfo, mode: str) -> Any:
        job = self.jobs.get(request_id)
        if job is None or not job.waiting or info.shape[3] != len(job.prompt) - job.num_held_tokens:
            return None   # the rest of the prompt after what this node holds, nothing else
        layout = self.engine.kv_layout
        shape = layout.shape(info.num_tokens)   # what new_kv makes
        if shape != tuple(info.shape):
            return None
        job.transfer_ids.add(transfer_id)
        if self.buffers is None:
            return self.engine.new_kv(info.num_tokens)
        # Raw KV is already the engine's bytes: keep the verified frames, the engine copies them once.
        if mode == "raw":
            return RawPieces(info)
        if self.on_device and mode in ("int8", "bf16"):   # decoded there; its allocator reuses memory
            return self.engine.new_device_kv(info.num_tokens)
        return self.buffers.take(shape, layout.dtype)

    @staticmethod
    def received_kv(result: TransferResult) -> torch.Tensor | RawPieces:
        """The destination `allocate` gave for this verified transfer, now written (bus.kv types it
        `object`: it knows no torch)."""
        return cast("torch.Tensor | RawPieces", result.kv)

    def _on_result(self, result: TransferResult) -> None:
        if self.on_device:
            self.quantizer.device_landing.synchronize()   # every chunk landed before the engine reads it
        self.post(KvArrived(result))

    def give_back(self, kv: Any) -> None:
        if isinstance(kv, RawPieces):
            kv.release()
        elif self.buffers is not None:   # a destination it did not hand out (on a GPU) is ignored
            self.buffers.give(kv)

    def give_back_arrived(self, job: DecodeJob) -> None:
        for result in job.arrived.values():
            self.give_back(result.kv)
        job.arrived.clear()

    def cancel(self, job: DecodeJob, reason: str) -> None:
        self.give_back_arrived(job)
        for transfer_id in list(job.transfer_ids):
            self.kv_thread.call(self.receiver.cancel, transfer_id, reason)

    def on_idle(self) -> None:
        """The node went quiet: hand the buffers kept for reuse back, but for one the next request
        will likely want (kv_buffers.py)."""
        if self.buffers is not None:
            self.buffers.drop_free(keep_bytes=IDLE_BUFFER_BYTES)

    def num_free_mib(self) -> float:
        return round(self.buffers.num_free_bytes / 2**20, 1) if self.buffers else 0.0

    def close(self) -> None:
        if self.started:
            self.kv_thread.run(self.receiver.close(), timeout=5)
