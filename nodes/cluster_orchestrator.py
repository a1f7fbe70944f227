"""One attempt of a cluster request (docs/CLUSTER.md): a `decode` request, its plan, and for a
`remote` plan the `prefill` request(s) feeding it, consumed concurrently; used by `Generation`
in nodes/cluster_client.py.

Contract: `await Attempt(generation, local, num_left).run() -> finish_reason`, or `Retry` (why,
which node, whether to fall back to local prefill, whether it spends a retry). Token indices
from the nodes are relative to the attempt; `deliver` maps them onto the stream (`base` = tokens
delivered before this attempt), drops duplicates and holds tokens that arrive ahead of a gap
until it is filled — by the stream itself or by the `tokens` list of the decode node's FINAL (or
the prefill node's FINAL for index 0). A gap left at the end is a `Retry` from the delivered
offset. Prefill failures are retried here with a new transfer id for the same decode request,
spending the generation's retry budget (`generation.spend_retry`). A request the bus endpoint
refuses to encode (a ValueError — `bus.codec.ProtocolError` — from `stream()`) is `Retry`
`malformed`, which the generation treats as fatal.
After a node loss the broker has already dropped the lost node, so the retry goes out at once
(`Retry.delay_s` 0, `IMMEDIATE`); other retries wait the client's `retry_delay_s`. A prefill
that recovers from a failure (a resumed stream, a re-sent prefill) is sent `urgent`: the prefill
node runs it before its queued new work.
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
import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bus.log import get_logger
from bus.mailbox import BusError
from bus.messages import Final
from nodes import wire
from nodes.wire import Code

NODE_LOSS = {Code.NODE_LOST, Code.REQUEST_LOST, Code.KV_TIMEOUT, Code.STALLED, Code.GAP}
# The broker reports these once the node is out of its registry: nothing to wait for.
IMMEDIATE = {Code.NODE_LOST, Code.REQUEST_LOST}
PREFILL_GRACE_S = 2.0
log = get_logger("cluster_client")


@dataclasses.dataclass(frozen=True, slots=True)
class StreamToken:
    index: int
    token_id: int
    text: str


class Retry(Exception):
    def __init__(self, code: str, message: str = "", node_id: str = "", *, local: bool = False,
                 counts: bool = True, delay_s: float | None = None, details: dict | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.node_id = code, message, node_id
        self.local, self.counts, self.delay_s, self.details = local, counts, delay_s, details or {}


def _retry_from(error: BusError, node_id: str = "") -> Retry:
    node_id, retry_after = wire.error_details(error.details, node_id)
    delay = retry_after or None
    if error.code == Code.NO_NODE:
        delay = max(delay or 0.0, 0.5)   # maybe mid re-registration after a broker restart
    elif error.code in IMMEDIATE:
        delay = 0.0
    details = {} if retry_after is None else {"retry_after_s": retry_after}
    return Retry(error.code, error.message, node_id, delay_s=delay, details=details)


def retry_delay(retry: Retry, default_s: float) -> float:
    """How long to wait before the retry: its own delay when it has one, else the default."""
    return default_s if retry.delay_s is None else retry.delay_s


class Attempt:
    def __init__(self, generation: Any, local: bool, num_left: int) -> None:
        self.g = generation
        self.local = local
        self.base = len(generation.tokens)
        self.prompt = generation.prompt + tuple(t.token_id for t in generation.tokens)
        self.sampling = dataclasses.replace(generation.sampling, max_tokens=num_left)
        self.bounds = wire.Bounds(max_tokens=num_left)   # what its nodes may send: indices below num_left
        self.pending: dict[int, StreamToken] = {}
        self.streams: list[Any] = []
        self.decode_node_id = ""
        self.decoding = False   # the decode node streams: it has its KV, prefill failures no longer matter

    # -- delivery --------------------------------------------------------------------------
    def deliver(self, relative_index: int, token_id: int, text: str) -> None:
        index = self.base + relative_index
        if index < len(self.g.tokens) or index in self.pending:
            return   # a duplicate (resume, retried prefill, replay after a gap)
        self.pending[index] = StreamToken(index, token_id, text)
        while len(self.g.tokens) in self.pending:
            self.g.emit(self.pending.pop(len(self.g.tokens)))

    def _open(self, service: str, body: dict, key: str = "") -> Any:
        try:
            stream = self.g.client.stream(service, body, key=key)
        except ValueError as exc:   # bus.codec.ProtocolError: the endpoint cannot encode it, nothing was sent
            raise Retry(Code.MALFORMED, str(exc), counts=False) from None   # fatal: the same body fails again
        self.streams.append(stream)
        return stream

    def _decode_key(self) -> str:
        """The session's key, or none once a decode node failed this request with a bad reply."""
        failed = any(f.startswith(f"{Code.BAD_REPLY}@") for f in self.g.trace.failures)
        return "" if failed else self.g.session_id

    @contextlib.contextmanager
    def _contained(self, stream: Any, service: str, body: Any, node_id: str) -> Iterator[None]:
        """Handling one reply: a body that does not parse, or an unexpected error acting on it, is
        `node_id` failing this request (Retry `bad_reply`), never an exception that ends it."""
        context = {"request_id": self.g.request_id, "service": service, "node_id": node_id,
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
        self.g.trace.num_bad_replies += 1
        if service == wire.DECODE:
            self.g.trace.num_failovers += 1
        raise Retry(Code.BAD_REPLY, f"the {service} node's reply was refused: {reason}", node_id)

    # -- the attempt -----------------------------------------------------------------------
    async def run(self) -> str:
        mode = wire.PrefillMode.LOCAL if self.local else wire.PrefillMode.AUTO
        body = wire.DecodeRequestBody(self.prompt, self.sampling, self.g.session_id, mode, self.base)
        started = time.monotonic()
        decode = self._open(wire.DECODE, wire.to_wire(body), key=self._decode_key())
        try:
            plan = await self._plan(decode)
            self.g.trace.timings["plan_s"] = round(time.monotonic() - started, 6)
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
        if self.pending and prefill_task is not None:   # index 0 may still be on its way
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(prefill_task, PREFILL_GRACE_S)
        if self.pending:
            raise Retry(Code.GAP, f"tokens {sorted(self.pending)[:3]}... arrived without their predecessors",
                        self.decode_node_id)
        return finish_reason

    async def _plan(self, decode: Any) -> wire.PlanBody:
        # The broker may hold the request in its queue while every decode node is full: wait for
        # the plan longer than the stream's stall timeout (past the queue's own timeout).
        decode.timeout = self.g.client.plan_timeout_s
        try:
            reply = await decode.__anext__()
        except BusError as exc:
            raise _retry_from(exc) from None
        except TimeoutError:
            raise Retry(Code.STALLED, "no plan within the plan timeout") from None
        finally:
            decode.timeout = self.g.client.stall_timeout_s
        with self._contained(decode, wire.DECODE, reply.body, wire.claimed_node(reply.body)):
            if isinstance(reply, Final):
                raise wire.Refused("the first reply must be a plan PARTIAL, not a FINAL")
            plan = wire.from_wire(wire.PlanBody, reply.body)
        self.decode_node_id = plan.node_id
        trace = self.g.trace
        trace.plans.append(plan.kind)
        trace.decode_node_ids.append(plan.node_id)
        trace.fallback_local = trace.fallback_local or (self.local and plan.kind == wire.PlanKind.LOCAL)
        return plan

    async def _consume_decode(self, decode: Any) -> str:
        try:
            async for reply in decode:
                with self._contained(decode, wire.DECODE, reply.body, self.decode_node_id):
                    if isinstance(reply, Final):
                        return self._on_decode_final(wire.from_wire(wire.DecodeDoneBody, reply.body, self.bounds))
                    if (token := wire.read_partial(reply.body, self.bounds)) is not None:
                        self.decoding = True
                        self.deliver(token.index, token.token_id, token.text)
        except BusError as exc:
            retry = _retry_from(exc, self.decode_node_id)
        except TimeoutError:
            retry = Retry(Code.STALLED, "the decode stream went silent", self.decode_node_id)
        else:
            retry = Retry(Code.PROTOCOL, "the decode stream ended without a FINAL", self.decode_node_id)
        if retry.code in NODE_LOSS:
            self.g.trace.num_failovers += 1
        raise retry

    def _on_decode_final(self, done: wire.DecodeDoneBody) -> str:
        for token in done.tokens:
            self.deliver(token.index, token.token_id, token.text)
        trace = self.g.trace
        trace.decode_final = wire.to_wire(done)
        trace.timings.update(done.timings.measured())
        return done.finish_reason or "stop"

    async def _prefill(self, plan: wire.PlanBody, decode_request_id: str) -> None:
        transfer_id = plan.transfer_id
        while True:
            body = wire.PrefillRequestBody(self.prompt, self.sampling, plan.node_id, plan.data_endpoint, transfer_id,
                                           decode_request_id, urgent=bool(self.g.trace.failures))   # a recovery
            # The scheduler balances prefill nodes by outstanding tokens: the key is the prompt's length.
            stream = self._open(wire.PREFILL, wire.to_wire(body), key=str(len(self.prompt)))
            try:
                await self._consume_prefill(stream)
                return
            except BusError as exc:
                if exc.code == Code.NO_NODE:
                    raise Retry(Code.NO_PREFILL_NODE, "no prefill node alive: prefill on the decode node",
                                local=True, counts=False) from None
                retry = _retry_from(exc)
            except TimeoutError:
                retry = Retry(Code.STALLED, "the prefill stream went silent")
            except Retry as bad_reply:   # from _contained: this prefill node failed the request
                retry = bad_reply
            stream.cancel()
            if self.decoding:   # e.g. the prefill node died after its kv_ready: nothing to redo
                return
            self.g.trace.num_prefill_retries += 1
            self.g.spend_retry(f"{wire.PREFILL_FAILURE}{retry.code}", retry.message, retry.node_id)
            transfer_id = uuid.uuid4().hex
            await asyncio.sleep(retry_delay(retry, self.g.client.retry_delay_s))

    async def _consume_prefill(self, stream: Any) -> None:
        async for reply in stream:
            with self._contained(stream, wire.PREFILL, reply.body, wire.claimed_node(reply.body)):
                if isinstance(reply, Final):
                    self._on_prefill_final(wire.from_wire(wire.PrefillDoneBody, reply.body, self.bounds))
                    return
                if (token := wire.read_partial(reply.body, self.bounds)) is not None:
                    self.deliver(token.index, token.token_id, token.text)

    def _on_prefill_final(self, done: wire.PrefillDoneBody) -> None:
        trace = self.g.trace
        trace.prefill_node_ids.append(done.node_id)
        if done.transfer is not None:
            trace.kv_wire_bytes += done.transfer.wire_bytes
            trace.kv_transfers.append(wire.to_wire(done.transfer))
        trace.timings.update(done.timings.measured())
        if done.token is not None:
            self.deliver(done.token.index, done.token.token_id, done.token.text)
