"""The decode side of a node (`pdbus decode`, and the decode half of `pdbus node --role both`).

Contract (docs/CLUSTER.md steps 2 and 4): a `decode` REQUEST is admitted (its KV blocks
reserved) and answered with a plan PARTIAL — `remote` (send me the KV: our data endpoint and a
transfer id), `cached` (a short suffix on top of this session's cached KV, prefilled here) or
`local` (asked with `prefill: "local"`, or always on a colocated node) — or ERROR `full` /
`rejected` after a CAPACITY update. Remote KV is received on the KV thread (nodes/decode_kv.py)
and joins the engine once both the verified transfer and the prefill node's `kv_ready` DIRECT are
here; any verified transfer for the request counts, so a retried prefill with a new transfer id
is accepted. Tokens stream as PARTIAL `token`; the FINAL `done` carries every token this node
streamed, usage, stage timings and node stats. CANCEL frees the request's blocks (or cancels its
receive) at once (`decode_cancelled`); admitted KV that never arrives is freed after
`[kv] timeout_s` with ERROR `kv_timeout`.
A request's lifecycle is `DecodeJob`'s state machine (nodes/decode_jobs.py); admission and plans
are `DecodeAdmission`'s (nodes/decode_admission.py), remote KV's two halves meeting `KvArrival`'s
(nodes/decode_arrival.py). Peer input is read on arrival (`wire.from_wire`): a malformed decode
REQUEST gets ERROR `bad_request` (or `rejected`); a `kv_ready` is dropped when malformed, or
refused by `DecodeJob.kv_ready_refusal`: counted in `counters`, logged as `kv_ready_dropped` with
ids and types, never the body. A handler, a token or an engine step that raises ends the requests
concerned with ERROR `internal` and frees their KV; the node serves on.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from bus.endpoint import Endpoint
from bus.log import get_logger
from bus.messages import Cancel, Direct, Request
from nodes import wire
from nodes.decode_admission import DecodeAdmission
from nodes.decode_arrival import KvArrival
from nodes.decode_forks import ForkGroups
from nodes.decode_jobs import (
    DecodeJob,
    KvArrived,
    done_body,
    prefill_here,
)
from nodes.decode_kv import KvLanding
from nodes.engines.base import DecodeRequest, Engine, TokenEvent
from nodes.loop_thread import LoopThread
from nodes.node_settings import NodeSettings
from nodes.runtime import GuardedWork, engine_bounds

__all__ = ["DecodeWork", "KvArrived"]


class DecodeWork(GuardedWork, DecodeAdmission, KvArrival):
    service = wire.DECODE

    def __init__(self, settings: NodeSettings, engine: Engine, kv_thread: LoopThread, *,
                 always_local: bool = False) -> None:
        self.settings, self.engine, self.kv_thread = settings, engine, kv_thread
        self.always_local = always_local
        self.jobs: dict[str, DecodeJob] = {}
        self.forks = ForkGroups()
        self.kv = KvLanding(settings, engine, kv_thread, self.jobs, lambda event: self.endpoint.inbox.put(event))
        self.bounds = engine_bounds(engine)
        self.counters: Counter[str] = Counter()   # refused / dropped / failed, by kind
        self.publish_capacity = lambda: None   # set by run_node: send CAPACITY now
        self.log = get_logger("decode")
        self.num_kv_bytes_received = 0
        # Blocks the last request refused as `full` needed: while fewer are available the node
        # reports `full` in its capacity, so the broker queues new requests instead of the client
        # retrying here until its retries run out.
        self.num_blocks_wanted = 0
        self._mib_per_block: float | None = None
        self._step_tokens: list[tuple[str, Any]] = []          # this step's (request id, token body)
        self._step_finals: list[tuple[str, Any]] = []          # ...and FINALs, sent after them

    # -- Work ------------------------------------------------------------------------------
    def prepare(self) -> str:
        self.engine.reserve_kv_memory()   # before READY: no request waits for the KV memory to fault in
        return "" if self.always_local else self.kv.start()

    def attach(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self.log = get_logger("decode", node_id=endpoint.node_id)

    def on_message(self, message: Any) -> bool:
        if isinstance(message, Request) and message.service == wire.DECODE:
            self._guard(message.request_id, self._on_request, message, ours=True)
        elif isinstance(message, Cancel) and message.request_id in self.jobs:
            self._guard(message.request_id, self._on_cancel, message.request_id)
        elif isinstance(message, Direct) and wire.claims(wire.KvReadyBody, message.body):
            self._on_kv_ready(message)
        elif isinstance(message, KvArrived):
            self._guard(message.result.request_id, self._on_kv_arrived, message.result)
        else:
            return False
        return True

    def work(self, now: float) -> bool:
        self._expire_waiting(now)
        if not self.engine.has_unfinished():
            return False
        if self.settings.step_delay_s:   # test-only: a slow stream to fail mid-way
            time.sleep(self.settings.step_delay_s)
        try:
            events = self.engine.step()
        except Exception:
            # Unsound KV ended alone: the others step again. Else nothing is left running: wait
            # for input rather than spin on a broken engine.
            return self._fail_step()
        for event in events:
            self._guard(event.request_id, self._on_token, event)
        self._send_step()
        return True

    def _send_step(self) -> None:
        """The step's tokens as one batch (one bus message per client), then the FINALs, which
        must follow their requests' last tokens."""
        tokens, finals = self._step_tokens, self._step_finals
        self._step_tokens, self._step_finals = [], []
        try:
            if tokens:
                self.endpoint.reply_batch(tokens)
        except Exception:   # the hand-over failed before sending anything: one request at a time
            for request_id, body in tokens:
                self._guard(request_id, self.endpoint.reply_batch, [(request_id, body)], ours=True)
        for request_id, done in finals:
            self._guard(request_id, self.endpoint.reply_final, request_id, done, ours=True)

    def on_idle(self) -> None:
        self.kv.on_idle()   # the node went quiet (nodes.heap trims next)

    def next_deadline(self) -> float | None:
        return min((j.expires_at for j in self.jobs.values() if j.waiting), default=None)

    def capacity(self) -> dict[str, float]:
        usage = self.engine.kv_usage()
        num_available = self._num_available_blocks(usage)
        if num_available >= self.num_blocks_wanted:
            self.num_blocks_wanted = 0
        return {"kv_blocks_total": usage.num_blocks, "kv_blocks_free": num_available,
                "kv_blocks_cached": usage.num_session_blocks, "block_size": usage.block_size,
                "kv_mib_cached": round(usage.num_session_blocks * self._block_mib(usage.block_size), 1),
                "kv_mib_slots": round(usage.num_slot_cache_bytes / 2**20, 1),
                "kv_mib_buffers": self.kv.num_free_mib(),
                "max_running": self.engine.max_num_seqs, "num_running": self._num_requests(),
                "full": int(self.num_blocks_wanted > 0), "prefills_lent": self.counters["plan.lent"],
                # Prompt tokens whose KV arrived, and those a kept prefix gave: the node's prefix hits.
                "kv_imported_tokens": self.engine.stats.num_imported_tokens,
                "prefix_reused_tokens": self.engine.stats.num_prefix_reused_tokens}

    def _block_mib(self, block_size: int) -> float:
        """Memory one KV block takes (MiB), so the memory finished sessions hold by design is known."""
        if self._mib_per_block is None:
            self._mib_per_block = self.engine.kv_layout.num_bytes(block_size) / 2**20
        return self._mib_per_block

    def close(self) -> None:
        self.kv.close()

    # -- admission and plans ---------------------------------------------------------------
    def _on_request(self, request: Request) -> None:
        try:
            body = wire.from_wire(wire.DecodeRequestBody, request.body, self.bounds)
        except wire.Refused as refusal:
            self.counters["request.refused"] += 1
            self.log.info("decode_refused", request_id=request.request_id, code=refusal.code, reason=refusal.reason)
            self.endpoint.reply_error(request.request_id, refusal.code, refusal.reason, node_id=self.endpoint.node_id)
            return
        job = DecodeJob(request.request_id, body.prompt, body.sampling, body.session_id, wire.PlanKind.REMOTE,
                        cache_salt=body.cache_salt, num_output_tokens=body.num_delivered)
        job.clock.mark("received")
        if self._forked(job, body):
            return
        self._plan(job, wire.PrefillMode.LOCAL if self._lends(body) else body.prefill)
        first = None   # a token this node streams before the engine's: see prefill_here
        if job.plan == wire.PlanKind.REMOTE:
            admitted = self._reserve(job)
            if admitted and body.fork_group and not (body.num_delivered or job.num_held_tokens):
                self.forks.lead(body.fork_group, job.request_id, job.prompt, job.cache_salt)
        else:
            local = DecodeRequest(job.request_id, job.prompt, job.sampling, session_id=job.session_id,
                                  cached_prefix_tokens=job.num_held_tokens, cache_salt=job.cache_salt,
                                  num_output_tokens=job.num_output_tokens)
            if job.sampling.prompt_logprobs is not None:
                local, first = prefill_here(self.engine, job, local)
            admitted = self._start(job, local)
        if admitted:
            self._send_plan(job)
            if first is not None:
                self._on_token(first)

    # -- streaming -------------------------------------------------------------------------
    def _on_token(self, event: TokenEvent) -> None:
        job = self.jobs.get(event.request_id)
        if job is None:
            return
        if event.token_id is not None:
            job.clock.mark("first_token")
            token = wire.TokenBody(event.index, event.token_id, event.text, event.logprobs)
            job.tokens.append(token)
            job.token_sent_at.append(time.monotonic())
            self._step_tokens.append((job.request_id, wire.to_wire(token)))
        if event.finished:
            del self.jobs[job.request_id]
            job.finish()
            job.clock.mark("finished")
            heartbeat = self.endpoint.heartbeat
            done = done_body(job, event, self.endpoint.node_id, self.engine.stats, self.num_kv_bytes_received,
                             time.monotonic() - heartbeat.expiry_s - heartbeat.interval_s)
            self._step_finals.append((job.request_id, wire.to_wire(done)))
            self.log.info("request_done", request_id=job.request_id, session_id=job.session_id, plan=job.plan,
                          finish_reason=event.finish_reason, usage=asdict(done.usage), timings=done.timings.measured())

    def _on_cancel(self, request_id: str) -> None:
        stage = self._release(request_id, "cancelled by the client", cancelled=True)
        self.publish_capacity()
        usage = self.engine.kv_usage()
        self.log.info("decode_cancelled", request_id=request_id, stage=stage, kv_blocks_free=usage.num_free_blocks)

    def _release(self, request_id: str, reason: str = "the decode node failed", *, cancelled: bool = False) -> str:
        """Free the request's KV: cancel its receives, or abort it in the engine (idempotent); the
        job ends failed, or cancelled by its client."""
        job = self.jobs.pop(request_id, None)
        self.engine.release_prefix(request_id)
        self.forks.drop(request_id)
        for follower_id in self.forks.end(request_id):   # a leader gone before its KV: they have none
            self._release(follower_id, "the request it forked from ended")
            self.endpoint.reply_error(follower_id, wire.Code.KV_FAILED, "the choice it forked from ended before "
                                      "its KV arrived", node_id=self.endpoint.node_id)
        stage = "kv_wait" if job is not None and job.waiting else "decode"
        if job is not None and job.waiting:
            self.kv.cancel(job, reason)
        else:
            self.engine.abort(request_id)
        if job is not None and cancelled:
            job.cancel()
        elif job is not None:
            job.fail()
        return stage

    # -- failures (GuardedWork: one request's bug ends that request, never the node) ----------
    def _fail_step(self) -> bool:
        """`engine.step()` raised. When the engine can name the requests whose KV is unsound
        (non-finite values a prefill node sent), those alone end and the rest step on (True);
        otherwise every running request was in that step, so each ends with ERROR `internal` and
        is aborted, which frees its KV (False)."""
        running = [j.request_id for j in self.jobs.values() if j.running]
        unsound = [r for r in self._unsound_requests() if r in running]
        request_ids = unsound or running
        self.counters["step.failed"] += 1
        self.log.exception("engine_step_failed", request_ids=request_ids, num_running=len(running),
                           unsound_kv=bool(unsound), count=self.counters["step.failed"])
        for request_id in request_ids:
            self._end_failed(request_id, reply=True)
        return bool(unsound)

    def _unsound_requests(self) -> list[str]:
        try:
            return self.engine.unsound_requests()
        except Exception:
            self.log.exception("unsound_scan_failed")
            return []

