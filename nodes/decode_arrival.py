"""How a remote plan's KV joins the engine (`KvArrival`, a part of `DecodeWork` in
nodes/decode_node.py, which holds the state it reads).

Contract: a waiting job starts once both halves are here: a verified transfer (`_on_kv_arrived`,
the KV thread's `KvArrived`) and the prefill node's `kv_ready` DIRECT (`_on_kv_ready`, with the
first token). Any verified transfer for the request counts, so a retried prefill with a new
transfer id is accepted; one whose token offset is not the job's counts as failed
(`kv.wrong_offset`). KV nobody waits for goes back to the buffers; a failed transfer is recorded
on the job (the client re-sends the prefill). A `kv_ready` that is malformed, or refused by
`DecodeJob.kv_ready_refusal`, is dropped: counted (`kv_ready.<reason>`) and logged as
`kv_ready_dropped` with ids and types, never the body. `_maybe_start_remote` admits the job (and
its fork followers) with that KV; `_expire_waiting(now)` ends the jobs whose KV did not come
within `[kv] timeout_s` with ERROR `kv_timeout`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bus.endpoint import Endpoint
from bus.kv import TransferResult
from bus.messages import Direct
from nodes import wire
from nodes.decode_jobs import DecodeJob, KvReadyRefusal
from nodes.decode_kv import KvLanding
from nodes.engines.base import DecodeRequest
from nodes.node_settings import NodeSettings


class KvArrival:
    settings: NodeSettings
    jobs: dict[str, DecodeJob]
    kv: KvLanding
    bounds: wire.Bounds
    counters: Counter[str]
    num_kv_bytes_received: int
    log: Any

    if TYPE_CHECKING:   # DecodeWork's other bases' (GuardedWork, DecodeAdmission), for the type checker only
        @property
        def endpoint(self) -> Endpoint: ...
        def _guard(self, request_id: str, handler: Callable[..., Any], *args: Any,
                   ours: bool = False) -> None: ...
        def _release(self, request_id: str, reason: str = "the node failed") -> Any: ...
        def _start(self, job: DecodeJob, request: DecodeRequest) -> bool: ...
        def _start_followers(self, leader: DecodeJob, kv: Any) -> None: ...

    def _on_kv_arrived(self, result: TransferResult) -> None:
        job = self.jobs.get(result.request_id)
        self.log.info("kv_arrived", request_id=result.request_id, transfer_id=result.transfer_id, ok=result.ok,
                      reason=result.reason, wire_bytes=result.stats.wire_bytes, token_offset=result.token_offset)
        if job is not None and result.ok and result.token_offset != job.num_held_tokens:
            self.counters["kv.wrong_offset"] += 1   # KV for another split of the prompt: not ours to use
            result = replace(result, ok=False, reason=f"KV from token {result.token_offset}, planned "
                                                      f"{job.num_held_tokens}")
        if job is None or not job.waiting or not result.ok:
            self.kv.give_back(result.kv)   # not wanted (any more); a failed one holds none
            if job is not None and job.waiting:
                job.transfer_failed(result.transfer_id)   # never decoded from: the client re-sends the prefill
            return
        job.kv_arrived(result)
        self._maybe_start_remote(job)

    def _on_kv_ready(self, direct: Direct) -> None:
        try:
            ready = wire.from_wire(wire.KvReadyBody, direct.body, self.bounds)
        except wire.Refused as refusal:
            self._drop_kv_ready(KvReadyRefusal.MALFORMED, direct, refusal.reason)
            return
        job = self.jobs.get(ready.request_id)
        why = KvReadyRefusal.UNKNOWN_REQUEST if job is None else job.kv_ready_refusal(ready.transfer_id, direct.peer)
        if why is not None:
            self._drop_kv_ready(why, direct, "", request_id=ready.request_id, transfer_id=ready.transfer_id)
            return
        assert job is not None   # else `why` is UNKNOWN_REQUEST
        job.accept_kv_ready(ready.transfer_id, direct.peer, ready.first_token_id)
        self._guard(job.request_id, self._maybe_start_remote, job)

    def _drop_kv_ready(self, reason: KvReadyRefusal, direct: Direct, detail: str, **ids: str) -> None:
        self.counters[f"kv_ready.{reason}"] += 1
        self.log.warning("kv_ready_dropped", reason=reason, peer=direct.peer, detail=detail,
                         body=wire.summary(direct.body), count=self.counters[f"kv_ready.{reason}"], **ids)

    def _maybe_start_remote(self, job: DecodeJob) -> None:
        transfer_id = job.ready_transfer_id()
        if transfer_id is None:
            return
        result = job.arrived[transfer_id]
        job.kv_raw_bytes, job.kv_wire_bytes = result.stats.raw_bytes, result.stats.wire_bytes
        self.num_kv_bytes_received += result.stats.wire_bytes
        job.clock.mark("kv_arrived")
        kv = self.kv.received_kv(result)
        request = DecodeRequest(job.request_id, job.prompt, job.sampling, kv=kv,
                                first_token_id=job.kv_ready[transfer_id], session_id=job.session_id,
                                cached_prefix_tokens=job.num_held_tokens, cache_salt=job.cache_salt,
                                num_output_tokens=job.num_output_tokens)
        del self.jobs[job.request_id]
        try:
            self._start(job, request)
            self._start_followers(job, kv)
        finally:
            self.kv.give_back_arrived(job)   # the engine copied what it admitted; the rest is unused

    def _expire_waiting(self, now: float) -> None:
        for job in [j for j in self.jobs.values() if j.waiting and now >= j.expires_at]:
            self._release(job.request_id, "no KV within the timeout")
            self.endpoint.reply_error(job.request_id, wire.Code.KV_TIMEOUT, f"no KV within {self.settings.kv_timeout_s} s")
