"""`ClusterClient`: the bus-level client of the cluster, orchestrating one request per
docs/CLUSTER.md (what the gateway wraps). No torch: it imports only the bus and the wire bodies.

Contract:
    async with ClusterClient("tcp://127.0.0.1:5555", tokenizer=None, max_retries=3) as client:
        generation = client.generate(prompt_token_ids | text, sampling, session_id=None, request_id=None)
        async for token in generation:      # StreamToken(index, token_id, text), each index once, in order
            ...
        generation.result                    # GenerationResult: token_ids, text, finish_reason, usage, trace
        await generation.aclose()            # or generation.cancel(): aborts both streams (KV freed)
    client.generate_blocking(...) -> GenerationResult   (from a thread with no running loop)
`trace` (RequestTrace) says which nodes served the request (decode/prefill node ids per attempt),
the plans, every failure and whether a failover or the local-prefill fallback happened, and the
per-stage timings (plan, queue, prefill, KV transfer, decode queue, decode, TTFT, total).
Failures: a decode node lost, stalled or timing out -> resume on another decode node with the
prompt plus every token delivered (indices continue; duplicates dropped); a prefill node lost or
`kv_failed` -> the prefill is re-sent with a new transfer id; `no_node` for prefill -> the decode
request is re-asked with `prefill: "local"`. Every retry counts against `max_retries`; past it, or
on `overloaded` / `rejected` / `bad_request` / `malformed`, iteration raises `ClusterError` (never a hang: every
wait is bounded by `stall_timeout_s`, the wait for a plan by `plan_timeout_s`, which exceeds the
broker queue's timeout). A decode node answering `full` (no KV room yet) is backpressure, not a
failure: the request is offered again after a growing pause (the node now advertises `full`, so
the broker places it elsewhere or holds it in its queue) without spending a retry, until it has
waited `plan_timeout_s` for room in all; then `overloaded` (503 + Retry-After at the gateway).
What the bus cannot carry never leaves: `generate` raises `wire.Uncarriable` (a ValueError
naming the field) for a session id over the bus's routing-key bound, strings that are not UTF-8,
ints beyond 64 bits, non-finite floats; and should the bus endpoint still refuse to encode a
request (`ProtocolError`, raised by `stream()` in the caller), iteration raises `ClusterError`
`malformed` at once, without a retry.
A node whose reply body does not parse (nodes/wire/) failed the request like a lost node:
the client fails over (decode resume, routed away from that node; prefill re-sent), spending a
retry, and counts it in `trace.num_bad_replies`. A bug in the client itself ends the stream with
`ClusterError("internal")`, logged with its traceback (never an exception left in a task).
Nothing is kept per request once it ends: its streams are cancelled (or finished) whatever the
ending, and the client holds no table of generations.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bus.client import BusClient
from bus.liveness import HeartbeatConfig
from bus.log import get_logger
from nodes import wire
from nodes.cluster_orchestrator import Attempt, Retry, StreamToken, retry_delay
from nodes.engines.base import SamplingParams

__all__ = ["ClusterClient", "ClusterError", "Generation", "GenerationResult", "RequestTrace", "StreamToken"]

FATAL_CODES = {wire.Code.OVERLOADED, wire.Code.REJECTED, wire.Code.BAD_REQUEST, wire.Code.MALFORMED,
               wire.Code.OVERSIZED}
FULL_BACKOFF_CAP_S = 1.0   # the longest pause between offers of a request that found no room
log = get_logger("cluster_client")


class ClusterError(Exception):
    """The request failed for good: `code`, `message`, and the trace of what was tried."""

    def __init__(self, code: str, message: str, trace: RequestTrace, **details: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.trace, self.details = code, message, trace, details


@dataclass
class RequestTrace:
    request_id: str
    session_id: str
    decode_node_ids: list[str] = field(default_factory=list)
    prefill_node_ids: list[str] = field(default_factory=list)
    plans: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)     # "code@node" per failed attempt
    num_failovers: int = 0                                 # decode resumes after a lost/stalled node
    num_prefill_retries: int = 0
    num_bad_replies: int = 0                               # replies that did not parse (nodes/wire/)
    fallback_local: bool = False
    kv_wire_bytes: int = 0
    kv_transfers: list[dict] = field(default_factory=list)  # each transfer's report (prefill FINAL), as sent
    timings: dict[str, float | None] = field(default_factory=dict)
    decode_final: dict | None = None                        # the decode FINAL, as read and sent again

    @property
    def failed_over(self) -> bool:
        return self.num_failovers > 0

    @property
    def kv_mode(self) -> str:
        """How the last KV transfer travelled (`int8`, `raw+lz4`, ...: the compression only when a
        codec was used); "" when no KV moved."""
        if not self.kv_transfers:
            return ""
        mode, compression = self.kv_transfers[-1].get("mode", "?"), self.kv_transfers[-1].get("compression", "")
        return mode if compression in ("none", "") else f"{mode}+{compression}"


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    session_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None
    usage: dict[str, int]
    trace: RequestTrace


class Generation:
    """One request's token stream (async iterator of StreamToken); created by `generate`."""

    def __init__(self, client: ClusterClient, prompt: tuple[int, ...], sampling: SamplingParams,
                 session_id: str, request_id: str) -> None:
        self.client, self.prompt, self.sampling = client, prompt, sampling
        self.request_id, self.session_id = request_id, session_id
        self.trace = RequestTrace(request_id, session_id)
        self.tokens: list[StreamToken] = []
        self.finish_reason: str | None = None
        self.num_retries = 0
        self.num_full = 0   # consecutive `full` answers: backpressure, not failures
        self.result: GenerationResult | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._started_at = time.monotonic()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> StreamToken:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        item = await self._queue.get()
        if isinstance(item, StreamToken):
            return item
        if isinstance(item, BaseException):
            raise item
        raise StopAsyncIteration

    async def collect(self) -> GenerationResult:
        async for _ in self:
            pass
        return self.result

    async def aclose(self) -> None:
        """Abort: both streams are cancelled (the nodes free the KV); iteration ends."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._queue.put_nowait(None)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # -- orchestration ---------------------------------------------------------------------
    def emit(self, token: StreamToken) -> None:
        if not self.tokens:
            self.trace.timings["ttft_s"] = round(time.monotonic() - self._started_at, 6)
        self.tokens.append(token)
        self._queue.put_nowait(token)

    async def _run(self) -> None:
        try:
            await self._attempts()
            self._finish()
            self._queue.put_nowait(None)
        except ClusterError as exc:
            self._queue.put_nowait(exc)
        except asyncio.CancelledError:
            self._queue.put_nowait(None)
            raise
        except Exception as exc:   # a bug must end the stream, never hang the caller
            log.exception("generation_failed", request_id=self.request_id)
            self._queue.put_nowait(ClusterError(wire.Code.INTERNAL, type(exc).__name__, self.trace))

    async def _attempts(self) -> None:
        local = False
        while self.finish_reason is None:
            num_left = self.sampling.max_tokens - len(self.tokens)
            if num_left <= 0:
                self.finish_reason = "length"
                return
            try:
                self.finish_reason = await Attempt(self, local, num_left).run()
            except Retry as retry:
                local = local or retry.local
                if retry.code in FATAL_CODES:
                    self.trace.failures.append(f"{retry.code}@{retry.node_id}")
                    raise ClusterError(retry.code, retry.message, self.trace, **retry.details) from None
                if retry.code == wire.Code.FULL:
                    await asyncio.sleep(self.wait_for_room(retry))
                    continue
                self.num_full = 0
                if retry.counts:
                    self.spend_retry(retry.code, retry.message, retry.node_id)
                else:
                    self.trace.failures.append(f"{retry.code}@{retry.node_id}")
                await asyncio.sleep(retry_delay(retry, self.client.retry_delay_s))

    def wait_for_room(self, retry: Retry) -> float:
        """The pause before offering a request that found its decode node full again; `overloaded`
        once it has waited `plan_timeout_s` in all (never a hang, never a spent retry)."""
        self.num_full += 1
        self.trace.failures.append(f"{retry.code}@{retry.node_id}")
        if time.monotonic() - self._started_at > self.client.plan_timeout_s:
            raise ClusterError(wire.Code.OVERLOADED, f"no decode node had room within {self.client.plan_timeout_s}s; "
                               f"last: {retry.message}", self.trace, retry_after_s=1.0)
        pause = self.client.retry_delay_s * 2 ** (self.num_full - 1)
        return max(retry_delay(retry, 0.0), min(pause, FULL_BACKOFF_CAP_S))

    def spend_retry(self, code: str, message: str, node_id: str = "") -> None:
        """Count one retry (decode resume or prefill re-send); ClusterError past the budget."""
        self.num_retries += 1
        self.trace.failures.append(f"{code}@{node_id}")
        if self.num_retries > self.client.max_retries:
            raise ClusterError(wire.Code.RETRIES_EXHAUSTED, f"gave up after {self.client.max_retries} retries; "
                               f"last: {code} {message}", self.trace)

    def _finish(self) -> None:
        self.trace.timings["total_s"] = round(time.monotonic() - self._started_at, 6)
        ids = [t.token_id for t in self.tokens]
        usage = {"prompt_tokens": len(self.prompt), "completion_tokens": len(ids)}
        self.result = GenerationResult(self.request_id, self.session_id, ids, "".join(t.text for t in self.tokens),
                                       self.finish_reason, usage, self.trace)


class ClusterClient:
    def __init__(self, broker_endpoint: str, *, node_id: str | None = None, heartbeat: HeartbeatConfig | None = None,
                 tokenizer: Any = None, max_retries: int = 3, stall_timeout_s: float = 30.0,
                 plan_timeout_s: float = 60.0, retry_delay_s: float = 0.2, security: Any = None) -> None:
        self.bus = BusClient(broker_endpoint, node_id, heartbeat=heartbeat, security=security)
        self.tokenizer = tokenizer
        self._started = False
        self.max_retries, self.stall_timeout_s, self.retry_delay_s = max_retries, stall_timeout_s, retry_delay_s
        self.plan_timeout_s = plan_timeout_s   # > [scheduler] queue_timeout_s: a queued request is not "stalled"

    def start(self, timeout: float = 10.0) -> ClusterClient:
        """Register with the broker (idempotent); TimeoutError when no broker answers."""
        if not self._started:
            self.bus.start(timeout)
            self._started = True
        return self

    def close(self) -> None:
        self.bus.close()
        self._started = False

    async def __aenter__(self) -> ClusterClient:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> ClusterClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompt: Sequence[int] | str, sampling: SamplingParams | None = None, *,
                 session_id: str | None = None, request_id: str | None = None) -> Generation:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs ClusterClient(tokenizer=...)")
            prompt = self.tokenizer.encode(prompt)
        prompt = tuple(int(t) for t in prompt)
        if not prompt:
            raise ValueError("empty prompt")
        sampling, session_id = sampling or SamplingParams(), session_id or uuid.uuid4().hex
        wire.check_request(prompt, sampling, session_id)   # wire.Uncarriable: nothing is sent
        return Generation(self, prompt, sampling, session_id, request_id or uuid.uuid4().hex)

    def generate_blocking(self, prompt: Sequence[int] | str, sampling: SamplingParams | None = None,
                          **options: Any) -> GenerationResult:
        async def run() -> GenerationResult:
            return await self.generate(prompt, sampling, **options).collect()
        return asyncio.run(run())

    def stream(self, service: str, body: dict, key: str = "") -> Any:
        return self.bus.stream(service, body, key=key, timeout=self.stall_timeout_s)

