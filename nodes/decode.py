"""The decode side of a node (`pdbus decode`, and the decode half of `pdbus node --role both`).

Contract (docs/CLUSTER.md steps 2 and 4): a `decode` REQUEST is admitted (its KV blocks
reserved) and answered with a plan PARTIAL — `remote` (send me the KV: our data endpoint and a
transfer id), `cached` (a short suffix on top of this session's cached KV, prefilled here) or
`local` (asked with `prefill: "local"`, or always on a colocated node) — or ERROR `full` /
`rejected` after a CAPACITY update. Remote KV is received on the KV thread (`KVReceiver`, into a
buffer of `nodes/kv_buffers.py`'s pool where the engine copies imported KV on admission, else a
new tensor of the engine's; a `raw` transfer's verified frames are kept as they are, RawPieces,
and copied by the engine on admission) and joins the engine once both the verified transfer and the
prefill node's `kv_ready` DIRECT are here; any verified transfer for the request counts, so a
retried prefill with a new transfer id is accepted. Tokens stream as PARTIAL `token`; the FINAL
`done` carries every token this node streamed, usage, stage timings and node stats. CANCEL
frees the request's blocks (or cancels its receive) at once (`decode_cancelled`); admitted KV
that never arrives is freed after `[kv] timeout_s` with ERROR `kv_timeout`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bus.endpoint import Endpoint
from bus.kv import KVReceiver, RawPieces, TransferResult
from bus.log import get_logger
from bus.messages import Cancel, Direct, Request
from nodes import cluster_wire as wire
from nodes.decode_jobs import DecodeJob, KvArrived
from nodes.engines.base import DecodeRequest, TokenEvent
from nodes.engines.kv_quant import TorchQuantizer
from nodes.kv_buffers import KVBufferPool
from nodes.node_settings import NodeSettings
from nodes.runtime import LoopThread

IDLE_BUFFER_BYTES = 64 << 20   # a quiet node keeps one received-KV buffer up to this size (kv_buffers.py)


class DecodeWork:
    def __init__(self, settings: NodeSettings, engine: Any, kv_thread: LoopThread, *, always_local: bool = False) -> None:
        self.settings, self.engine, self.kv_thread = settings, engine, kv_thread
        self.always_local = always_local
        self.quantizer = TorchQuantizer(compile=settings.kv_compile)
        # Received KV lands in reused buffers where the engine copies it on admission (see
        # nodes/kv_buffers.py: fresh pages made a 45 MiB int8 receive 8x slower); else a new tensor each.
        self.buffers = KVBufferPool() if getattr(engine, "copies_imported_kv", False) else None
        self.receiver = KVReceiver(self._allocate, lambda transfer_id, kv: self._give_back(kv),   # failed receives
                                   quantizer=self.quantizer, bind=settings.kv_bind,
                                   advertise=settings.kv_advertise,
                                   security=settings.security,
                                   on_result=self._on_result)
        self.jobs: dict[str, DecodeJob] = {}
        self.endpoint: Endpoint | None = None
        self.publish_capacity = lambda: None   # set by run_node: send CAPACITY now
        self.log = get_logger("decode")
        self.num_kv_bytes_received = 0
        # Blocks the last request refused as `full` needed: while fewer are available the node
        # reports `full` in its capacity, so the broker queues new requests instead of the client
        # retrying here until its retries run out.
        self.num_blocks_wanted = 0
        self._mib_per_block: float | None = None

    # -- Work ------------------------------------------------------------------------------
    def prepare(self) -> str:
        self.engine.reserve_kv_memory()   # before READY: no request waits for the KV memory to fault in
        if self.always_local:
            return ""
        if self.settings.kv_compile and self.settings.kv_quant != "raw":
            self.quantizer.warmup()
        return self.kv_thread.run(self.receiver.start())

    def attach(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.log = get_logger("decode", node_id=endpoint.node_id)

    def on_message(self, message: Any) -> bool:
        if isinstance(message, Request) and message.service == wire.DECODE:
            self._on_request(message)
        elif isinstance(message, Cancel) and message.request_id in self.jobs:
            self._on_cancel(message.request_id)
        elif isinstance(message, Direct) and isinstance(message.body, dict) and message.body.get("type") == wire.KV_READY:
            self._on_kv_ready(message.body)
        elif isinstance(message, KvArrived):
            self._on_kv_arrived(message.result)
        else:
            return False
        return True

    def work(self, now: float) -> bool:
        self._expire_waiting(now)
        if not self.engine.has_unfinished():
            return False
        if self.settings.step_delay_s:   # test-only: a slow stream to fail mid-way
            time.sleep(self.settings.step_delay_s)
        for event in self.engine.step():
            self._on_token(event)
        return True

    def on_idle(self) -> None:
        """The node went quiet (nodes.heap trims next): hand the KV buffers kept for reuse back,
        but for one the next request will likely want (kv_buffers.py)."""
        if self.buffers is not None:
            self.buffers.drop_free(keep_bytes=IDLE_BUFFER_BYTES)

    def next_deadline(self) -> float | None:
        return min((j.expires_at for j in self.jobs.values() if not j.running), default=None)

    def capacity(self) -> dict[str, float]:
        usage = self.engine.kv_usage()
        num_waiting = sum(not j.running for j in self.jobs.values())
        num_available = self._num_available_blocks(usage)
        if num_available >= self.num_blocks_wanted:
            self.num_blocks_wanted = 0
        return {"kv_blocks_total": usage.num_blocks, "kv_blocks_free": num_available,
                "kv_blocks_cached": usage.num_session_blocks, "block_size": usage.block_size,
                "kv_mib_cached": round(usage.num_session_blocks * self._block_mib(usage.block_size), 1),
                "kv_mib_slots": round(usage.num_slot_cache_bytes / 2**20, 1),
                "kv_mib_buffers": round(self.buffers.num_free_bytes / 2**20, 1) if self.buffers else 0.0,
                "max_running": self.engine.config.max_num_seqs, "num_running": len(self.engine.running) + num_waiting,
                "full": int(self.num_blocks_wanted > 0)}

    def _block_mib(self, block_size: int) -> float:
        """Memory one KV block takes (MiB), so the memory finished sessions hold by design is known."""
        if self._mib_per_block is None:
            runner = getattr(self.engine, "runner", None)
            self._mib_per_block = runner.new_kv(block_size).nbytes / 2**20 if runner is not None else 0.0
        return self._mib_per_block

    def _num_available_blocks(self, usage: Any) -> int:
        """Blocks a new request could get: free ones plus finished sessions' (evicted LRU-first
        when needed), minus those held for requests whose KV is on its way."""
        return usage.num_free_blocks + usage.num_session_blocks - self._reserved_blocks()

    def close(self) -> None:
        if not self.always_local:
            self.kv_thread.run(self.receiver.close(), timeout=5)

    # -- admission and plans ---------------------------------------------------------------
    def _on_request(self, request: Request) -> None:
        try:
            job, mode = self._parse(request)
        except wire.BadRequest as exc:
            self.endpoint.reply_error(request.request_id, wire.BAD_REQUEST, str(exc))
            return
        job.clock.mark("received")
        if job.plan == wire.PLAN_REMOTE:
            admitted = self._reserve(job)
        else:
            admitted = self._start(job, DecodeRequest(job.request_id, job.prompt, job.sampling,
                                                      session_id=job.session_id))
        if admitted:
            self._send_plan(job)

    def _parse(self, request: Request) -> tuple[DecodeJob, str]:
        body = wire.body_map(request.body)
        prompt = wire.token_ids_from_wire(body)
        session_id = body.get("session_id") or None
        mode = body.get("prefill", "auto")
        if mode not in ("auto", "local"):
            raise wire.BadRequest(f"prefill must be 'auto' or 'local', got {mode!r}")
        job = DecodeJob(request.request_id, prompt, wire.sampling_from_wire(body.get("sampling", {})),
                        session_id, wire.PLAN_REMOTE)
        num_cached = self.engine.cached_session_tokens(session_id) if session_id else 0
        if self.always_local or mode == "local":
            job.plan = wire.PLAN_LOCAL
        elif 0 < num_cached < len(prompt) and len(prompt) - num_cached <= self.settings.local_suffix_tokens:
            job.plan, job.num_cached_tokens = wire.PLAN_CACHED, num_cached
        return job, mode

    def _reserve(self, job: DecodeJob) -> bool:
        """Admit a remote-prefill request: hold its blocks until its KV arrives."""
        admission = self.engine.check_admission(DecodeRequest(job.request_id, job.prompt, job.sampling))
        num_waiting = sum(not j.running for j in self.jobs.values())
        fits = (admission.ok and admission.num_blocks_needed <= self._num_available_blocks(self.engine.kv_usage())
                and len(self.engine.running) + num_waiting < self.engine.config.max_num_seqs)
        if not fits:
            if admission.status != "rejected":
                self.num_blocks_wanted = max(self.num_blocks_wanted, admission.num_blocks_needed, 1)
            return self._refuse(job, admission.status if admission.status == "rejected" else "full",
                                admission.reason or "no KV room for a waiting request")
        job.num_blocks = admission.num_blocks_needed
        job.expires_at = time.monotonic() + self.settings.kv_timeout_s
        self.jobs[job.request_id] = job
        return True

    def _start(self, job: DecodeJob, request: DecodeRequest) -> bool:
        admission = self.engine.add_request(request)
        if not admission.ok:
            return self._refuse(job, admission.status, admission.reason)
        job.running, job.num_blocks = True, 0
        job.clock.mark("admitted")
        self.jobs[job.request_id] = job
        return True

    def _refuse(self, job: DecodeJob, status: str, reason: str) -> bool:
        self.publish_capacity()   # so the policy skips us on the client's retry
        code = wire.REJECTED if status == "rejected" else wire.FULL
        self.endpoint.reply_error(job.request_id, code, reason, node_id=self.endpoint.node_id)
        self.log.info("decode_refused", request_id=job.request_id, code=code, reason=reason)
        return False

    def _send_plan(self, job: DecodeJob) -> None:
        plan = {"type": "plan", "plan": job.plan, "node_id": self.endpoint.node_id}
        if job.plan == wire.PLAN_REMOTE:
            transfer_id = uuid.uuid4().hex
            job.transfer_ids.add(transfer_id)
            plan |= {"data_endpoint": self.endpoint.core.data_endpoint, "transfer_id": transfer_id}
        elif job.plan == wire.PLAN_CACHED:
            plan["num_cached_tokens"] = job.num_cached_tokens
        job.clock.mark("planned")
        self.endpoint.reply(job.request_id, plan)

    def _reserved_blocks(self) -> int:
        return sum(j.num_blocks for j in self.jobs.values() if not j.running)

    # -- KV arrival (allocate and on_result run on the KV thread) ----------------------------
    def _allocate(self, transfer_id: str, request_id: str, info: Any, mode: str) -> Any:
        job = self.jobs.get(request_id)
        if job is None or job.running or info.shape[3] != len(job.prompt):
            return None
        runner = self.engine.runner
        c = runner.config
        shape = (c.num_layers, 2, c.num_kv_heads, info.num_tokens, c.head_dim)   # what new_kv makes
        if shape != tuple(info.shape):
            return None
        job.transfer_ids.add(transfer_id)
        if self.buffers is None:
            return runner.new_kv(info.num_tokens)
        # Raw KV is already the engine's bytes: keep the verified frames, the engine copies them once.
        return RawPieces(info) if mode == "raw" else self.buffers.take(shape, runner.dtype)

    def _give_back(self, kv: Any) -> None:
        if isinstance(kv, RawPieces):
            kv.release()
        elif self.buffers is not None:
            self.buffers.give(kv)

    def _on_result(self, result: TransferResult) -> None:
        self.endpoint.inbox.put(KvArrived(result))

    def _on_kv_arrived(self, result: TransferResult) -> None:
        job = self.jobs.get(result.request_id)
        self.log.info("kv_arrived", request_id=result.request_id, transfer_id=result.transfer_id, ok=result.ok,
                      reason=result.reason, wire_bytes=result.stats.wire_bytes)
        if job is None or job.running or not result.ok:
            self._give_back(result.kv)   # not wanted (any more); a failed one holds none
            return   # a failed transfer is never decoded from: the client re-sends the prefill
        job.arrived[result.transfer_id] = result
        self._maybe_start_remote(job)

    def _on_kv_ready(self, body: dict) -> None:
        job = self.jobs.get(body.get("request_id", ""))
        if job is not None and not job.running:
            job.kv_ready[body.get("transfer_id", "")] = int(body.get("first_token_id", 0))
            self._maybe_start_remote(job)

    def _maybe_start_remote(self, job: DecodeJob) -> None:
        transfer_id = next((t for t in job.kv_ready if t in job.arrived), None)
        if transfer_id is None:
            return
        result = job.arrived[transfer_id]
        job.kv_raw_bytes, job.kv_wire_bytes = result.stats.raw_bytes, result.stats.wire_bytes
        self.num_kv_bytes_received += result.stats.wire_bytes
        job.clock.mark("kv_arrived")
        request = DecodeRequest(job.request_id, job.prompt, job.sampling, kv=result.kv,
                                first_token_id=job.kv_ready[transfer_id], session_id=job.session_id)
        job.num_blocks = 0
        del self.jobs[job.request_id]
        self._start(job, request)
        self._give_back_arrived(job)   # the engine copied what it admitted; the rest is unused

    def _give_back_arrived(self, job: DecodeJob) -> None:
        for result in job.arrived.values():
            self._give_back(result.kv)
        job.arrived.clear()

    def _expire_waiting(self, now: float) -> None:
        for job in [j for j in self.jobs.values() if not j.running and now >= j.expires_at]:
            self._drop_waiting(job, "no KV within the timeout")
            self.endpoint.reply_error(job.request_id, wire.KV_TIMEOUT, f"no KV within {self.settings.kv_timeout_s} s")

    def _drop_waiting(self, job: DecodeJob, reason: str) -> None:
        self.jobs.pop(job.request_id, None)
        self._give_back_arrived(job)
        for transfer_id in list(job.transfer_ids):
            self.kv_thread.call(self.receiver.cancel, transfer_id, reason)

    # -- streaming -------------------------------------------------------------------------
    def _on_token(self, event: TokenEvent) -> None:
        job = self.jobs.get(event.request_id)
        if job is None:
            return
        if event.token_id is not None:
            job.clock.mark("first_token")
            job.tokens.append([event.index, event.token_id, event.text])
            self.endpoint.reply(job.request_id, wire.token_body(event.index, event.token_id, event.text))
        if event.finished:
            del self.jobs[job.request_id]
            job.clock.mark("finished")
            final = self._final_body(job, event)
            self.endpoint.reply_final(job.request_id, final)
            self.log.info("request_done", request_id=job.request_id, session_id=job.session_id, plan=job.plan,
                          finish_reason=event.finish_reason, usage=final["usage"], timings=final["timings"])

    def _final_body(self, job: DecodeJob, event: TokenEvent) -> dict:
        stats = self.engine.stats
        num_output = event.index + (1 if event.token_id is not None else 0)
        return {"type": "done", "node_id": self.endpoint.node_id, "finish_reason": event.finish_reason,
                "tokens": job.tokens, "plan": job.plan,
                "usage": {"prompt_tokens": len(job.prompt), "completion_tokens": num_output},
                "timings": {"kv_wait_s": job.clock.seconds("planned", "kv_arrived"),
                            "decode_queue_s": job.clock.seconds("admitted", "first_token"),
                            "decode_s": job.clock.seconds("first_token", "finished")},
                "stats": {"num_cached_tokens": job.num_cached_tokens, "kv_raw_bytes": job.kv_raw_bytes,
                          "kv_wire_bytes": job.kv_wire_bytes,
                          "node_kv_bytes_received": self.num_kv_bytes_received,
                          "node_prefilled_tokens": stats.num_prefilled_tokens,
                          "node_imported_tokens": stats.num_imported_tokens,
                          "node_reused_tokens": stats.num_reused_tokens}}

    def _on_cancel(self, request_id: str) -> None:
        job = self.jobs[request_id]
        if job.running:
            del self.jobs[request_id]
            self.engine.abort(request_id)
            stage = "decode"
        else:
            self._drop_waiting(job, "cancelled by the client")
            stage = "kv_wait"
        self.publish_capacity()
        usage = self.engine.kv_usage()
        self.log.info("decode_cancelled", request_id=request_id, stage=stage, kv_blocks_free=usage.num_free_blocks)
