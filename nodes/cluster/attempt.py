"""One attempt of a cluster request (docs/CLUSTER.md): a `decode` request, its plan, and for a
`remote` plan the `prefill` request(s) feeding it, consumed concurrently; run by `Generation`
(nodes/cluster/generation.py), which owns the stream, the trace and the retry budget.

Contract: `await Attempt(owner, spec).run() -> finish_reason`, or `Retry` (nodes/cluster/retries.py:
why, which node, whether to fall back to local prefill, whether it spends a retry).
- `spec` (`AttemptSpec`) is what the attempt asks for, fixed when it starts: the prompt with every
  token delivered so far, the sampling with what is left to generate, `base` (how many tokens were
  delivered before it), local or not, and how long to wait for a plan and between prefill re-sends.
- `owner` (`AttemptOwner`; both in attempt_inputs.py) is all an attempt sees of its generation: `num_delivered`, `emit(token)`,
  the `trace` it records into, `spend_retry(...)` and `open_stream(...)` on the bus.
Token indices from the nodes are relative to the attempt; `deliver` maps them onto the stream
(`spec.base`), drops duplicates and holds tokens that arrive ahead of a gap until it is filled —
by the stream itself or by the `tokens` list of the decode node's FINAL (its most recent tokens:
those a lost broker may not have forwarded), or the prefill node's FINAL for index 0. A gap left
at the end, or fewer tokens than the FINAL's usage counts, is a `Retry` from the delivered offset. Prefill
failures are retried here with a new transfer id for the same decode request, spending the
generation's retry budget (`owner.spend_retry`). A request the bus endpoint refuses to encode (a
ValueError — `bus.codec.ProtocolError` — from `open_stream()`) is `Retry` `malformed`, which the
generation treats as fatal. A prefill that recovers from a failure (a resumed stream, a re-sent
prefill) is sent `urgent`: the prefill node runs it before its queued new work.
Every reply body is read on arrival (`wire.from_wire`, nodes/wire/). One that does not parse is its node
failing this request: `Retry` `bad_reply`, logged with the node id and the body's type and size
(never its contents); the stream is cancelled and the request fails over as for a lost node (a
decode resume, a prefill re-sent with a new transfer id), spending a retry. That decode node still
holds the session's routing key, so the resume goes without a key (the broker places it by its
request id). An unexpected exception while handling one reply is contained the same way (logged
with its traceback): it fails over, never ends the request as `internal`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bus.log import get_logger
from bus.mailbox import BusError, ReplyStream
from bus.messages import Final
from nodes import wire
from nodes.cluster.attempt_inputs import AttemptOwner, AttemptSpec
from nodes.cluster.results import StreamToken
from nodes.cluster.retries import NODE_LOSS, Retry, retry_delay, retry_from
from nodes.wire import Code
from scheduler.prefill_keys import prefill_key

PREFILL_GRACE_S = 2.0
log = get_logger("cluster_client")   # one logger name for the whole client


class Attempt:
    def __init__(self, owner: AttemptOwner, spec: AttemptSpec) -> None:
        self.owner, self.spec, self.trace = owner, spec, owner.trace
        # What its nodes may send: indices below what is left to generate.
        self.bounds = wire.Bounds(max_tokens=spec.sampling.max_tokens)
        self.pending: dict[int, StreamToken] = {}
        self.num_finished = 0   # stream index past the decode FINAL's last token (its usage says)
        self.streams: list[ReplyStream] = []
        self.decode_node_id = ""
        self.decoding = False   # the decode node streams: it has its KV, prefill failures no longer matter

    # -- delivery --------------------------------------------------------------------------
    def deliver(self, token: wire.TokenBody) -> None:
        index = self.spec.base + token.index
        if index < self.owner.num_delivered or index in self.pending:
            return   # a duplicate (resume, retried prefill, replay after a gap)
        self.pending[index] = StreamToken(index, token.token_id, token.text, token.logprobs)
        while self.owner.num_delivered in self.pending:
            self.owner.emit(self.pending.pop(self.owner.num_delivered))

    def _open(self, service: str, body: dict, key: str = "") -> ReplyStream:
        try:
            stream = self.owner.open_stream(service, body, key=key)
        except ValueError as exc:   # bus.codec.ProtocolError: the endpoint cannot encode it, nothing was sent
            raise Retry(Code.MALFORMED, str(exc), counts=False) from None   # fatal: the same body fails again
        self.streams.append(stream)
        return stream

    def _decode_key(self) -> str:
        """The session's key, or none once a decode node failed this request with a bad reply."""
        failed = any(f.startswith(f"{Code.BAD_REPLY}@") for f in self.trace.failures)
        return "" if failed else (self.spec.route_key or self.spec.session_id)

    @contextlib.contextmanager
    def _contained(self, stream: ReplyStream, service: str, body: Any, node_id: str) -> Iterator[None]:
        """Handling one reply: a body that does not parse, or an unexpected error acting on it, is
        `node_id` failing this request (Retry `bad_reply`), never an exception that ends it."""
        context = {"request_id": self.spec.request_id, "service": service, "node_id": node_id,
                   "bus_request_id": stream.request_id, "body": wire.summary(body)}
        try:
            yield
        except wire.Refused as refused:
            reason = refused.reason
            log.warning("bad_reply", reason=reason, **context)
        except Exception as exc:   # our bug on one reply: visible in the log, contained like a bad reply
            reason = f"handling it raised {type(exc).__name__}"
            log.exception("reply_handling_failed", **context)
        else:
            return
        self.trace.num_bad_replies += 1
        if service == wire.DECODE:
            self.trace.num_failovers += 1
        raise Retry(Code.BAD_REPLY, f"the {service} node's reply was refused: {reason}", node_id)

    # -- the attempt -----------------------------------------------------------------------
    async def run(self) -> str:
        spec = self.spec
        mode = wire.PrefillMode.LOCAL if spec.local else wire.PrefillMode.AUTO
        body = wire.DecodeRequestBody(spec.prompt, spec.sampling, spec.session_id, mode, spec.base, spec.cache_salt,
                                      self.owner.prefill_backlog.num_tokens, spec.fork_group)
        started = time.monotonic()
        decode = self._open(wire.DECODE, wire.to_wire(body), key=self._decode_key())
        try:
            plan = await self._plan(decode)
            self.trace.timings["plan_s"] = round(time.monotonic() - started, 6)
            decode_task = asyncio.create_task(self._consume_decode(decode))
            prefill_task = (asyncio.create_task(self._prefill(plan, decode.request_id))
                            if plan.kind == wire.PlanKind.REMOTE else None)
            try:
                return await self._join(decode_task, prefill_task)
            finally:
                tasks = [task for task in (decode_task, prefill_task) if task is not None]
                for task in tasks:
                    task.cancel()   # no-op for a finished one; gather collects every outcome
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for stream in self.streams:
                stream.cancel()   # no-op for finished streams; CANCEL frees KV on the nodes

    async def _join(self, decode_task: asyncio.Task, prefill_task: asyncio.Task | None) -> str:
        if prefill_task is not None:
            done, _ = await asyncio.wait({decode_task, prefill_task}, return_when=asyncio.FIRST_COMPLETED)
            if decode_task not in done:
                prefill_task.result()   # a failed prefill ends the attempt (Retry / ClusterError)
        finish_reason = await decode_task
        # Index 0, or the prompt logprobs in the prefill FINAL, may still be on their way.
        if (self._missing() or self._awaits_prompt_logprobs()) and prefill_task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(prefill_task, PREFILL_GRACE_S)
        if self.pending:
            raise Retry(Code.GAP, f"tokens {sorted(self.pending)[:3]}... arrived without their predecessors",
                        self.decode_node_id)
        if self._missing():   # the FINAL repeats only recent tokens: an older one was lost for good
            raise Retry(Code.GAP, f"{self._missing()} tokens before the FINAL never arrived", self.decode_node_id)
        return finish_reason

    def _awaits_prompt_logprobs(self) -> bool:
        return self.spec.sampling.prompt_logprobs is not None and not self.owner.prompt_logprobs

    def _missing(self) -> int:
        return len(self.pending) + max(0, self.num_finished - self.owner.num_delivered - len(self.pending))

    async def _plan(self, decode: ReplyStream) -> wire.PlanBody:
        # The broker may hold the request in its queue while every decode node is full: wait for
        # the plan longer than the stream's stall timeout (past the queue's own timeout).
        stall_timeout_s, decode.timeout = decode.timeout, self.spec.plan_timeout_s
        try:
            reply = await decode.__anext__()
        except BusError as exc:
            raise retry_from(exc) from None
        except TimeoutError:
            raise Retry(Code.STALLED, "no plan within the plan timeout") from None
        finally:
            decode.timeout = stall_timeout_s
        with self._contained(decode, wire.DECODE, reply.body, wire.claimed_node(reply.body)):
            if isinstance(reply, Final):
                raise wire.Refused("the first reply must be a plan PARTIAL, not a FINAL")
            plan = wire.from_wire(wire.PlanBody, reply.body)
            if plan.num_cached_tokens >= len(self.spec.prompt):
                raise wire.Refused(f"the plan holds {plan.num_cached_tokens} tokens of a "
                                   f"{len(self.spec.prompt)}-token prompt: nothing would be left to send")
        self.decode_node_id = plan.node_id
        trace = self.trace
        trace.plans.append(plan.kind)
        trace.decode_node_ids.append(plan.node_id)
        if plan.kind == wire.PlanKind.REMOTE:   # the prefill node's FINAL says what its own cache gave
            trace.num_kv_held_tokens = plan.num_cached_tokens
        else:
            trace.num_cached_tokens = plan.num_cached_tokens
        trace.fallback_local = trace.fallback_local or (self.spec.local and plan.kind == wire.PlanKind.LOCAL)
        return plan

    async def _consume_decode(self, decode: ReplyStream) -> str:
        try:
            async for reply in decode:
                with self._contained(decode, wire.DECODE, reply.body, self.decode_node_id):
                    if isinstance(reply, Final):
                        return self._on_decode_final(wire.from_wire(wire.DecodeDoneBody, reply.body, self.bounds))
                    if (token := wire.read_partial(reply.body, self.bounds)) is not None:
                        self.decoding = True
                        self.deliver(token)
        except BusError as exc:
            retry = retry_from(exc, self.decode_node_id)
        except TimeoutError:
            retry = Retry(Code.STALLED, "the decode stream went silent", self.decode_node_id)
        else:
            retry = Retry(Code.PROTOCOL, "the decode stream ended without a FINAL", self.decode_node_id)
        if retry.code in NODE_LOSS:
            self.trace.num_failovers += 1
        raise retry

    def _on_decode_final(self, done: wire.DecodeDoneBody) -> str:
        if done.usage.completion_tokens > self.spec.sampling.max_tokens:
            raise wire.Refused(f"the FINAL counts {done.usage.completion_tokens} tokens of at most "
                               f"{self.spec.sampling.max_tokens}")
        for token in done.tokens:
            self.deliver(token)
        if done.prompt_logprobs:
            self.owner.keep_prompt_logprobs(done.prompt_logprobs)
        self.num_finished = self.spec.base + done.usage.completion_tokens
        trace = self.trace
        trace.decode_final = wire.to_wire(done)
        trace.timings.update(done.timings.measured())
        return done.finish_reason or "stop"

    async def _prefill(self, plan: wire.PlanBody, decode_request_id: str) -> None:
        with self.owner.prefill_backlog.holding(len(self.spec.prompt) - plan.num_cached_tokens) as prefilled:
            await self._prefill_until_sent(plan, decode_request_id, prefilled)

    async def _prefill_until_sent(self, plan: wire.PlanBody, decode_request_id: str,
                                  prefilled: Callable[[], None]) -> None:
        transfer_id, prompt = plan.transfer_id, self.spec.prompt
        while True:
            body = wire.PrefillRequestBody(prompt, self.spec.sampling, plan.node_id, plan.data_endpoint, transfer_id,
                                           decode_request_id, urgent=bool(self.trace.failures),   # a recovery
                                           cache_salt=self.spec.cache_salt, kv_offset=plan.num_cached_tokens,
                                           num_output_tokens=self.spec.base)
            # The key: the prompt's length (the scheduler balances prefill nodes by outstanding tokens)
            # and its opening's hash (prompts that share one go where its KV is likely cached).
            stream = self._open(wire.PREFILL, wire.to_wire(body), key=prefill_key(prompt, self.spec.cache_salt))
            try:
                await self._consume_prefill(stream, prefilled)
                return
            except BusError as exc:
                if exc.code == Code.NO_NODE:
                    raise Retry(Code.NO_PREFILL_NODE, "no prefill node alive: prefill on the decode node",
                                local=True, counts=False, delay_s=0.0) from None
                retry = retry_from(exc)
            except TimeoutError:
                retry = Retry(Code.STALLED, "the prefill stream went silent")
            except Retry as bad_reply:   # from _contained: this prefill node failed the request
                retry = bad_reply
            stream.cancel()
            if self.decoding:   # e.g. the prefill node died after its kv_ready: nothing to redo
                return
            self.trace.num_prefill_retries += 1
            if retry.code == Code.DRAINING and self.owner.bounce_off_drain():
                self.trace.failures.append(f"{wire.PREFILL_FAILURE}{retry.code}@{retry.node_id}")
            else:
                self.owner.spend_retry(f"{wire.PREFILL_FAILURE}{retry.code}", retry.message, retry.node_id)
            transfer_id = uuid.uuid4().hex
            await asyncio.sleep(retry_delay(retry, self.spec.retry_delay_s))

    async def _consume_prefill(self, stream: ReplyStream, prefilled: Callable[[], None]) -> None:
        async for reply in stream:
            with self._contained(stream, wire.PREFILL, reply.body, wire.claimed_node(reply.body)):
                if isinstance(reply, Final):
                    self._on_prefill_final(wire.from_wire(wire.PrefillDoneBody, reply.body, self.bounds))
                    return
                if (token := wire.read_partial(reply.body, self.bounds)) is not None:
                    prefilled()   # out of the prefill node's queue; its KV is on its way
                    self.deliver(token)

    def _on_prefill_final(self, done: wire.PrefillDoneBody) -> None:
        trace = self.trace
        trace.prefill_node_ids.append(done.node_id)
        if done.transfer is not None:
            trace.kv_wire_bytes += done.transfer.wire_bytes
            trace.kv_transfers.append(wire.to_wire(done.transfer))
        trace.timings.update(done.timings.measured())
        trace.num_cached_tokens = int(done.stats.get("num_cached_tokens", 0))
        if done.prompt_logprobs:
            self.owner.keep_prompt_logprobs(done.prompt_logprobs)
        if done.token is not None:
            self.deliver(done.token)
