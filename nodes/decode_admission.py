"""How a decode node admits a request and chooses its plan (`DecodeAdmission`, a part of
`DecodeWork` in nodes/decode_node.py, which holds the state it reads).

Contract: `_plan` picks `local`, `cached` or `remote` (decode_jobs.plan_job), `_lends` decides to
prefill here a prompt a busy prefill pool would queue (nodes/lending.py), `_forked` makes a later
choice of a prompt a follower of its first one (nodes/decode_forks.py) and `_start_followers` starts
them from its KV; `_reserve` admits a remote plan (its KV blocks held until the KV arrives: `full`
or `rejected` otherwise), `_start` admits into the engine, `_refuse` answers the ERROR and publishes
capacity so the policy skips the node on the client's retry, `_send_plan` answers PARTIAL 0.
Available blocks: free, plus kept sessions' and prefixes' (evictable), less pinned and reserved.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus.endpoint import Endpoint
from nodes import wire
from nodes.decode_forks import ForkGroups
from nodes.decode_jobs import DecodeJob, plan_body, plan_job, refusal_code
from nodes.engines.base import DecodeRequest, Engine, KvUsage
from nodes.node_settings import NodeSettings


class DecodeAdmission:
    settings: NodeSettings
    engine: Engine
    jobs: dict[str, DecodeJob]
    forks: ForkGroups
    counters: Counter[str]
    always_local: bool
    num_blocks_wanted: int
    publish_capacity: Callable[[], None]
    log: Any

    if TYPE_CHECKING:   # GuardedWork's (DecodeWork's other base), declared for the type checker only
        @property
        def endpoint(self) -> Endpoint: ...

    def _num_available_blocks(self, usage: KvUsage) -> int:
        """Blocks a new request could get: free ones plus kept sessions' and prefixes' (evicted
        LRU-first when needed) but for pinned ones, minus those reserved for requests whose KV is
        on its way."""
        return usage.num_free_blocks + usage.num_session_blocks - usage.num_pinned_blocks - self._reserved_blocks()

    def _forked(self, job: DecodeJob, body: wire.DecodeRequestBody) -> bool:
        """A later choice of a prompt whose first choice waits here for its KV: plan `forked` and
        wait for that KV (nodes/decode_forks.py); False when there is no such leader."""
        leader = None if body.num_delivered else self.forks.leader_for(body.fork_group, job.prompt, job.cache_salt)
        if leader is None:
            return False
        job.plan = wire.PlanKind.FORKED
        if self._reserve(job):
            self.forks.follow(leader, job.request_id)
            self.counters["plan.forked"] += 1
            self._send_plan(job)
        return True

    def _start_followers(self, leader: DecodeJob, kv: Any) -> None:
        for follower_id in self.forks.end(leader.request_id):
            follower = self.jobs.pop(follower_id, None)
            if follower is None or not follower.waiting:
                continue
            follower.clock.mark("kv_arrived")
            self._start(follower, DecodeRequest(follower_id, follower.prompt, follower.sampling, kv=kv,
                                                session_id=follower.session_id, cache_salt=follower.cache_salt))

    def _plan(self, job: DecodeJob, mode: wire.PrefillMode) -> None:
        # A short rest is prefilled here only while the node is not busy (decode_jobs.plan_job says
        # why). Prompt logprobs need every prompt position computed: no kept KV is started from.
        whole = job.sampling.prompt_logprobs is not None
        plan_job(job, local=self.always_local or mode == wire.PrefillMode.LOCAL,
                 num_session=self.engine.cached_session_tokens(job.session_id) if job.session_id and not whole else 0,
                 short=self.settings.local_suffix_tokens if self._has_spare_compute() and not whole else 0,
                 hold=lambda: 0 if whole else self.engine.hold_prefix(job.request_id, job.prompt, job.cache_salt))

    def _lends(self, body: wire.DecodeRequestBody) -> bool:
        """Prefill this prompt here though a prefill node could: this node would finish it sooner
        than the prefill nodes, given the client's backlog there (nodes/lending.py)."""
        rule, prompt, backlog = self.settings.lend, len(body.prompt), body.prefill_backlog_tokens
        # The guards first: lending is off by default, and then no request counts the node's queue.
        lend = (body.prefill == wire.PrefillMode.AUTO
                and rule.may_lend(num_prompt_tokens=prompt, backlog_tokens=backlog, num_requests=self._num_requests())
                and rule.sooner_here(prompt, backlog, self._own_prefill_tokens()))
        if lend:
            self.counters["plan.lent"] += 1
        return lend

    def _own_prefill_tokens(self) -> int:
        """Prompt tokens this node has yet to prefill: those of its running local and cached plans
        before their first token (a chunk already run still counts: an estimate that errs high)."""
        return sum(len(j.prompt) - j.num_cached_tokens for j in self.jobs.values()
                   if j.running and not j.tokens and j.plan in (wire.PlanKind.LOCAL, wire.PlanKind.CACHED))

    def _num_requests(self) -> int:
        """Requests holding KV here: running in the engine, or admitted and waiting for their KV."""
        return self.engine.num_running + sum(j.waiting for j in self.jobs.values())

    def _has_spare_compute(self) -> bool:
        return self._num_requests() < self.settings.local_prefill_max_running

    def _reserve(self, job: DecodeJob) -> bool:
        """Admit a remote-prefill request: hold its blocks until its KV arrives."""
        admission = self.engine.check_admission(DecodeRequest(job.request_id, job.prompt, job.sampling))
        fits = (admission.ok and admission.num_blocks_needed <= self._num_available_blocks(self.engine.kv_usage())
                and self._num_requests() < self.engine.max_num_seqs)
        if not fits:
            code = refusal_code(admission)
            if code == wire.Code.FULL:
                self.num_blocks_wanted = max(self.num_blocks_wanted, admission.num_blocks_needed, 1)
            return self._refuse(job, code, admission.reason or "no KV room for a waiting request")
        job.reserve(admission.num_blocks_needed, time.monotonic() + self.settings.kv_timeout_s)
        self.jobs[job.request_id] = job
        return True

    def _start(self, job: DecodeJob, request: DecodeRequest) -> bool:
        admission = self.engine.add_request(request)
        if not admission.ok:
            return self._refuse(job, refusal_code(admission), admission.reason)
        job.start()
        job.clock.mark("admitted")
        self.jobs[job.request_id] = job
        return True

    def _refuse(self, job: DecodeJob, code: wire.Code, reason: str) -> bool:
        self.engine.release_prefix(job.request_id)
        job.fail()
        self.publish_capacity()   # so the policy skips us on the client's retry
        self.endpoint.reply_error(job.request_id, code, reason, node_id=self.endpoint.node_id)
        self.log.info("decode_refused", request_id=job.request_id, code=code, reason=reason)
        return False

    def _send_plan(self, job: DecodeJob) -> None:
        plan = plan_body(job, self.endpoint.node_id, self.endpoint.core.data_endpoint)
        job.clock.mark("planned")
        self.endpoint.reply(job.request_id, wire.to_wire(plan))

    def _reserved_blocks(self) -> int:
        return sum(j.num_blocks for j in self.jobs.values() if j.waiting)
