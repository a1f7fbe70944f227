"""The prefill side of a node (`pdbus prefill`, and the prefill half of `pdbus node --role both`).

Contract (docs/CLUSTER.md step 3): a `prefill` REQUEST (`wire.PrefillRequestBody`) joins a `PrefillBatcher` (a batch runs
when the queued prompts reach `max_batch_tokens` or the oldest waited `max_wait`); after the pass
the first token goes back at once (PARTIAL `token` index 0), the KV goes to the decode node's data
endpoint on the KV thread (`KVSender`, mode/compression from `[kv]`; with `[kv] device_codec` the
send starts as the engine begins encoding the prompt's KV on its device, so chunks leave while later
layers compute, `Engine.on_kv_export`), then a DIRECT `kv_ready` to
the decode node — from the KV thread the moment the send is verified, so the decode node never
waits for this node's next prefill pass — and the FINAL `done` {token, transfer report, timings}
to the client. A failed send answers ERROR `kv_failed`.
A batch runs as a pass of chunks (`Engine.start_prefill`): each `work()` call computes at most
`chunk_tokens` prompt tokens (`[engine] prefill_chunk_tokens`, default 256), and the node loop takes
its inbox between two calls.
A request with `"urgent": true` (a client re-sending a lost prefill or resuming a stream after a
failover) waits in a lane of its own that runs before any other queued prompt and without the
batching wait, and interrupts a pass of new work between two chunks (that pass resumes afterwards
from its KV so far), so recovery never waits behind new work for more than one chunk. An urgent
pass itself runs in one step (up to `max_batch_tokens`): nothing may interrupt it.
`queued_tokens` in the capacity counts queued prompts plus what running passes have left.
CANCEL drops a queued prompt, stops computing it in a running pass, or aborts its send (the receiver
frees its buffer), logged as `prefill_cancelled` with `stage`.
A request body is read on arrival (`wire.from_wire`, nodes/wire/; ERROR `bad_request`). A handler that
raises ends its request with ERROR `internal` (`GuardedWork`); a pass whose start or chunk raises
ends the prompts in it that have no first token yet the same way (`prefill_pass_failed`), and
the node serves on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from bus.endpoint import Endpoint
from bus.kv import FaultInjector, KVError, KVSender, TransferReport
from bus.kv.frames import CHUNK
from bus.kv.layout import DEFAULT_CHUNK_BYTES
from bus.kv.link import gbit
from bus.log import get_logger
from bus.messages import Cancel, Request
from nodes import wire
from nodes.engines.base import Engine, PrefillPass, PrefillRequest, PrefillResult
from nodes.engines.kv_export import kv_tail
from nodes.engines.kv_quant import TorchQuantizer
from nodes.loop_thread import LoopThread
from nodes.node_settings import NodeSettings
from nodes.prefill_batcher import PrefillBatcher
from nodes.prefill_jobs import FIRST_TOKEN_POLL_S, KvSendDone, PrefillJob, RunningPass
from nodes.runtime import GuardedWork, engine_bounds
from scheduler.prefix_hashes import MAX_REPORTED_PREFIXES


class PrefillWork(GuardedWork):
    service = wire.PREFILL

    def __init__(self, settings: NodeSettings, engine: Engine, kv_thread: LoopThread) -> None:
        self.settings, self.engine, self.kv_thread = settings, engine, kv_thread
        config = engine.config
        self.batcher = PrefillBatcher(max_batch_tokens=config.max_batch_tokens, max_wait_s=config.prefill_max_wait_s)
        self.urgent = PrefillBatcher(max_batch_tokens=config.max_batch_tokens, max_wait_s=0.0)
        self.chunk_tokens = config.prefill_chunk_tokens
        self.passes: list[RunningPass] = []   # the last one runs; an urgent pass sits on the one it interrupted
        self.quantizer = TorchQuantizer(compile=settings.kv_compile)
        faults = (FaultInjector(flip_probability=1.0, only_kinds=(CHUNK,), max_faults=settings.kv_faults)
                  if settings.kv_faults else None)   # test-only: checksum failures on the data plane
        chunk_bytes = DEFAULT_CHUNK_BYTES if settings.kv_chunk_mib is None else int(settings.kv_chunk_mib * 2**20)
        self.sender = KVSender(quantizer=self.quantizer, faults=faults, security=settings.security,
                               link_bytes_per_s=gbit(settings.kv_link_gbit), chunk_bytes=chunk_bytes)
        self.jobs: dict[str, PrefillJob] = {}
        self.bounds = engine_bounds(engine)
        self.counters: Counter[str] = Counter()   # refused / failed, by kind
        self.log = get_logger("prefill")
        self.num_kv_bytes_sent = 0
        self.num_prefilled = 0   # in the capacity, so every pass ends in a report (see `capacity`)
        engine.on_kv_export = self._on_kv_export

    # -- Work ------------------------------------------------------------------------------
    def prepare(self) -> str:
        if self.settings.kv_compile and self.settings.kv_quant != "raw":
            self.quantizer.warmup()   # compile now, not inside the first request's transfer
        return ""

    def attach(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self.log = get_logger("prefill", node_id=endpoint.node_id)

    def on_message(self, message: Any) -> bool:
        if isinstance(message, Request) and message.service == wire.PREFILL:
            self._guard(message.request_id, self._on_request, message, ours=True)
        elif isinstance(message, Cancel) and message.request_id in self.jobs:
            self._guard(message.request_id, self._on_cancel, message.request_id)
        elif isinstance(message, KvSendDone):
            self._guard(message.request_id, self._on_send_done, message)
        else:
            return False
        return True

    def work(self, now: float) -> bool:
        """Run one chunk of the current pass, starting a pass first when one is due."""
        if not (self.passes and self.passes[-1].urgent):
            self._start_pass(self.urgent.next_batch(now), urgent=True)
        if not self.passes:
            self._start_pass(self.batcher.next_batch(now), urgent=False)
        if not self.passes:
            return False
        running = self.passes[-1]
        try:
            results = running.prefill.step()
        except Exception:
            self._fail_pass(running.request_ids)
            results = []
        for result in results:
            self._guard(result.request_id, self._on_prefilled, result)
        if running not in self.passes or running.prefill.done:   # failed, or finished
            self.passes = [p for p in self.passes if p is not running]
            self.num_prefilled += len(running.request_ids)
        return True

    def _start_pass(self, batch: list[PrefillRequest], *, urgent: bool) -> None:
        if not batch:
            return
        request_ids = tuple(r.request_id for r in batch)
        try:
            self.passes.append(RunningPass(self._begin_pass(batch, urgent), urgent, request_ids))
        except Exception:   # the batch left its queue: its prompts must end here, not hang
            self._fail_pass(request_ids)

    def _begin_pass(self, batch: list[PrefillRequest], urgent: bool) -> PrefillPass:
        if self.passes:   # only an urgent batch gets here: the pass of new work waits one chunk at most
            self.log.info("prefill_interrupted", request_ids=[r.request_id for r in batch],
                          num_tokens_left=self.passes[-1].prefill.num_remaining_tokens)
        if self.settings.prefill_delay_s:
            self.log.info("prefill_started", request_ids=[r.request_id for r in batch])
            time.sleep(self.settings.prefill_delay_s)
        for request in batch:
            self.jobs[request.request_id].clock.mark("prefill_started")
        # Nothing interrupts an urgent pass, so it runs as one step (chunks cost up to 25% in bf16).
        chunk_tokens = self.urgent.max_batch_tokens if urgent else self.chunk_tokens
        return self.engine.start_prefill(batch, chunk_tokens=chunk_tokens)

    def _fail_pass(self, request_ids: tuple[str, ...]) -> None:
        """The engine raised starting or stepping a pass: its prompts with no first token yet end
        with ERROR `internal` (those already sending their KV go on); the pass is dropped."""
        failed = [r for r in request_ids if r in self.jobs and self.jobs[r].first_token is None]
        self.passes = [p for p in self.passes if p.request_ids != request_ids]   # ids are unique per pass
        self.counters["pass.failed"] += 1
        self.log.exception("prefill_pass_failed", request_ids=failed, count=self.counters["pass.failed"])
        for request_id in failed:
            self._end_failed(request_id, reply=True)

    def on_idle(self) -> None:
        return None   # nothing kept for a busy node beyond what the heap trim returns

    def next_deadline(self) -> float | None:
        return min((d for d in (self.urgent.deadline(), self.batcher.deadline()) if d is not None), default=None)

    def capacity(self) -> dict[str, float]:
        # The scheduler adds the tokens it routed here since our last report to `queued_tokens`.
        # A prompt that arrives and runs between two reports leaves `queued_tokens` unchanged, so
        # without the counter no report would follow and its tokens would count against this node
        # for good (it would look busy while idle, and recoveries would queue on the other node).
        stats = self.engine.stats
        return {"max_batch_tokens": self.batcher.max_batch_tokens,
                "queued_tokens": self.batcher.num_queued_tokens + self.urgent.num_queued_tokens
                + sum(p.prefill.num_remaining_tokens for p in self.passes),
                "num_prefilled": self.num_prefilled,
                # Prompt tokens seen, and those the prefix cache gave: the node's hit rate.
                "prompt_tokens": stats.num_prefilled_tokens + stats.num_prefix_cached_tokens,
                "prefix_cached_tokens": stats.num_prefix_cached_tokens,
                # The prefixes its cache holds (px.<hash> -> tokens), for prefix-aware routing.
                **self.engine.prefix_holdings(MAX_REPORTED_PREFIXES)}

    def close(self) -> None:
        self.kv_thread.run(self.sender.close(), timeout=5)

    # -- requests --------------------------------------------------------------------------
    def _on_request(self, request: Request) -> None:
        try:
            body = wire.from_wire(wire.PrefillRequestBody, request.body, self.bounds)
        except wire.Refused as refusal:
            self.counters["request.refused"] += 1
            self.log.info("prefill_refused", request_id=request.request_id, reason=refusal.reason)
            self.endpoint.reply_error(request.request_id, wire.Code.BAD_REQUEST, refusal.reason)
            return
        job = PrefillJob(request.request_id, body.request_id, body.decode_node_id, body.data_endpoint,
                         body.transfer_id, len(body.prompt), urgent=body.urgent, kv_offset=body.kv_offset)
        job.clock.mark("received")
        self.jobs[job.request_id] = job
        prefill = PrefillRequest(request.request_id, body.prompt, body.sampling, body.cache_salt, body.num_output_tokens)
        (self.urgent if job.urgent else self.batcher).add(prefill, time.monotonic())

    def _on_prefilled(self, result: PrefillResult) -> None:
        job = self.jobs.get(result.request_id)
        if job is None:   # cancelled while the pass ran
            return
        job.clock.mark("prefilled")
        first_token = wire.TokenBody(0, result.first_token_id, result.text, result.logprobs)
        job.num_cached_tokens, job.prompt_logprobs = result.num_cached_tokens, result.prompt_logprobs
        self.endpoint.reply(job.request_id, wire.to_wire(first_token))
        job.first_token = first_token   # after the PARTIAL: a send that started in the pass may now send kv_ready
        if not job.sending:   # else it started inside the pass (_on_kv_export)
            job.sending = True
            self.kv_thread.submit(self._send(job, result.kv))

    def _on_kv_export(self, request_id: str, export: Any) -> None:
        """The engine began encoding a prompt's KV on its device: send it now, its chunks leaving
        while later layers compute. Not for a prompt whose head the decode node holds (the tail
        is cut once every layer has landed, at the end of the pass)."""
        job = self.jobs.get(request_id)
        if job is None or job.sending or job.kv_offset:
            return
        job.export, job.sending = export, True
        self.kv_thread.submit(self._send(job, export))

    async def _send(self, job: PrefillJob, kv: Any) -> None:
        try:
            if job.kv_offset:   # the decode node holds the head of this prompt's KV: send the rest
                kv = kv_tail(kv, job.kv_offset)
            report = await self.sender.send(job.data_endpoint, job.transfer_id, job.decode_request_id, kv,
                                            mode=self.settings.kv_quant, compression=self.settings.kv_compression,
                                            token_offset=job.kv_offset)
            # Tell the decode node now: the node's thread may be inside its next prefill pass
            # for a second or more before it handles KvSendDone. A send started inside the pass
            # may finish before the first token is sampled: it waits for it here.
            while job.first_token is None:
                if self.jobs.get(job.request_id) is not job:   # released: cancelled, or its pass failed
                    return
                await asyncio.sleep(FIRST_TOKEN_POLL_S)
            ready = wire.KvReadyBody(job.decode_request_id, job.transfer_id, job.first_token.token_id)
            self.endpoint.send_direct(job.decode_node_id, wire.to_wire(ready))
            done = KvSendDone(job.request_id, report)
        except KVError as exc:
            done = KvSendDone(job.request_id, None, str(exc))
        except Exception as exc:   # a bug must fail this transfer (kv_failed), never leave it hanging
            self.log.exception("kv_send_crashed", request_id=job.request_id, transfer_id=job.transfer_id)
            done = KvSendDone(job.request_id, None, f"internal: {exc!r}")
        self.endpoint.inbox.put(done)

    def _on_send_done(self, done: KvSendDone) -> None:
        job = self.jobs.pop(done.request_id, None)
        if job is None:
            return
        job.clock.mark("sent")
        if done.report is None:
            self.log.warning("kv_send_failed", request_id=job.request_id, error=done.error)
            self.endpoint.reply_error(job.request_id, wire.Code.KV_FAILED, done.error, transfer_id=job.transfer_id,
                                      node_id=self.endpoint.node_id)
            return
        self.num_kv_bytes_sent += done.report.stats.wire_bytes
        final = self._done_body(job, done.report)
        self.endpoint.reply_final(job.request_id, wire.to_wire(final))
        self.log.info("prefill_done", request_id=job.request_id, decode_request_id=job.decode_request_id,
                      num_prompt_tokens=job.num_prompt_tokens, wire_bytes=done.report.stats.wire_bytes,
                      timings=final.timings.measured())

    def _done_body(self, job: PrefillJob, report: TransferReport) -> wire.PrefillDoneBody:
        """The FINAL `done`: the first token again, the transfer's report, stage timings, node counters."""
        s = report.stats
        transfer = wire.TransferReport(job.transfer_id, s.mode, s.compression, s.raw_bytes, s.wire_bytes, s.retries,
                                       s.checksum_failures, s.resends, round(s.seconds, 6))
        timings = wire.PrefillTimings(queue_s=job.clock.seconds("received", "prefill_started"),
                                      prefill_s=job.clock.seconds("prefill_started", "prefilled"),
                                      kv_transfer_s=job.clock.seconds("prefilled", "sent"))
        stats: dict[str, int | float] = {"num_prefilled_tokens": self.engine.stats.num_prefilled_tokens,
                                         "num_prefix_cached_tokens": self.engine.stats.num_prefix_cached_tokens,
                                         "num_cached_tokens": job.num_cached_tokens,
                                         "num_kv_bytes_sent": self.num_kv_bytes_sent}
        return wire.PrefillDoneBody(self.endpoint.node_id, job.first_token, transfer, timings, stats,
                                    job.prompt_logprobs)

    def _on_cancel(self, request_id: str) -> None:
        transfer_id = self.jobs[request_id].transfer_id
        stage = self._release(request_id, "cancelled by the client")
        self.log.info("prefill_cancelled", request_id=request_id, stage=stage, transfer_id=transfer_id)

    def _release(self, request_id: str, reason: str = "the prefill node failed") -> str:
        """Forget the request wherever it is: its send aborted, its prompt dropped from a pass or a queue."""
        job = self.jobs.pop(request_id, None)
        if job is None:
            return "gone"
        if job.export is not None:   # sent from inside its pass: the send fails now, the prompt stops
            job.export.cancel(reason)
        in_pass = any(p.prefill.cancel(request_id) for p in self.passes)
        if job.sending:
            self.kv_thread.submit(self.sender.abort(job.transfer_id, reason))
            return "transfer"
        if in_pass:
            return "prefill"
        self.batcher.remove(request_id) or self.urgent.remove(request_id)
        return "queue"
