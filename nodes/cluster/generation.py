"""`Generation`: one request's token stream across its attempts (docs/CLUSTER.md), made by
`ClusterClient.generate` (nodes/cluster/client.py, whose docstring is the whole contract).

It runs `Attempt`s (nodes/cluster/attempt.py) until one finishes, each resuming from the tokens
delivered so far, and is the only `AttemptOwner` there is: it hands the caller each token once, in
order, keeps the `RequestTrace` and the retry budget, and opens the attempts' bus streams. What a
`Retry` means is decided here: fatal codes end the request, `full` is backpressure (offered again
after a pause growing to `FULL_BACKOFF_CAP_S`, `overloaded` past `plan_timeout_s`, never a spent
retry), the rest spend a retry (`retries_exhausted` past `max_retries`) unless they say not to.
A bug ends the stream with `ClusterError("internal")`, logged with its traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING

from bus.log import get_logger
from bus.mailbox import ReplyStream
from nodes import wire
from nodes.cluster.attempt import Attempt
from nodes.cluster.attempt_inputs import AttemptSpec, PrefillBacklog
from nodes.cluster.results import ClusterError, GenerationResult, RequestTrace, StreamToken
from nodes.cluster.retries import FATAL_CODES, MAX_DRAIN_BOUNCES, NO_PREFILL_NODE_MEMORY_S, Retry, retry_delay

if TYPE_CHECKING:
    from nodes.cluster.client import ClusterClient

FULL_BACKOFF_CAP_S = 1.0   # the longest pause between offers of a request that found no room
log = get_logger("cluster_client")   # one logger name for the whole client


class Generation:
    """One request's token stream (async iterator of StreamToken); created by `generate`."""

    def __init__(self, client: ClusterClient, prompt: tuple[int, ...], sampling: wire.SamplingParams,
                 session_id: str, request_id: str, cache_salt: str = "", *, fork_group: str = "",
                 route_key: str = "") -> None:
        self.client, self.prompt, self.sampling = client, prompt, sampling
        self.request_id, self.session_id, self.cache_salt = request_id, session_id, cache_salt
        self.fork_group, self.route_key = fork_group, route_key
        self.trace = RequestTrace(request_id, session_id)
        self.tokens: list[StreamToken] = []
        self.finish_reason: str | None = None
        self.num_retries = 0
        self.num_full = 0   # consecutive `full` answers: backpressure, not failures
        self.num_drain_bounces = 0   # `draining` answers: a node left or switched role under the request
        self.result: GenerationResult | None = None
        self.prompt_logprobs: tuple[wire.TokenLogprobs | None, ...] = ()   # with `sampling.prompt_logprobs`
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
        assert self.result is not None   # set when the stream ends
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

    # -- what its attempts see (AttemptOwner) ---------------------------------------------------
    @property
    def num_delivered(self) -> int:
        return len(self.tokens)

    def emit(self, token: StreamToken) -> None:
        if not self.tokens:
            self.trace.timings["ttft_s"] = round(time.monotonic() - self._started_at, 6)
        self.tokens.append(token)
        self._queue.put_nowait(token)

    def keep_prompt_logprobs(self, values: tuple[wire.TokenLogprobs | None, ...]) -> None:
        """Kept once, for the caller's prompt (a resumed attempt's prompt also holds delivered tokens)."""
        if not self.prompt_logprobs:
            self.prompt_logprobs = values[:len(self.prompt)]

    @property
    def prefill_backlog(self) -> PrefillBacklog:
        return self.client.prefill_backlog

    def open_stream(self, service: str, body: dict, key: str = "") -> ReplyStream:
        return self.client.stream(service, body, key=key)

    def spend_retry(self, code: str, message: str, node_id: str = "") -> None:
        """Count one retry (decode resume or prefill re-send); ClusterError past the budget."""
        self.num_retries += 1
        self.trace.failures.append(f"{code}@{node_id}")
        if self.num_retries > self.client.max_retries:
            raise ClusterError(wire.Code.RETRIES_EXHAUSTED, f"gave up after {self.client.max_retries} retries; "
                               f"last: {code} {message}", self.trace)

    def attempt_spec(self, local: bool) -> AttemptSpec:
        """The next attempt: the prompt with every token delivered so far, for what is left."""
        delivered = tuple(t.token_id for t in self.tokens)
        sampling = dataclasses.replace(self.sampling, max_tokens=self.sampling.max_tokens - len(delivered))
        if self.prompt_logprobs:   # already have them: a resume need not compute them again
            sampling = dataclasses.replace(sampling, prompt_logprobs=None)
        # No prefill node a moment ago (all dead, or all switched to decode by the planner): ask for
        # a local prefill at once instead of finding out again, one round trip per request.
        local = local or time.monotonic() < self.client.no_prefill_node_until
        return AttemptSpec(self.request_id, self.session_id, self.prompt + delivered, sampling, len(delivered),
                           local, self.client.plan_timeout_s, self.client.retry_delay_s, self.cache_salt,
                           self.fork_group, self.route_key)

    # -- the attempts ------------------------------------------------------------------------

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
            if len(self.tokens) >= self.sampling.max_tokens:
                self.finish_reason = "length"
                return
            try:
                self.finish_reason = await Attempt(self, self.attempt_spec(local)).run()
            except Retry as retry:
                local = local or retry.local
                if retry.code == wire.Code.NO_PREFILL_NODE:
                    self.client.no_prefill_node_until = time.monotonic() + NO_PREFILL_NODE_MEMORY_S
                if retry.code in FATAL_CODES:
                    self.trace.failures.append(f"{retry.code}@{retry.node_id}")
                    raise ClusterError(retry.code, retry.message, self.trace, **retry.details) from None
                if retry.code == wire.Code.FULL:
                    await asyncio.sleep(self.wait_for_room(retry))
                    continue
                self.num_full = 0
                if retry.counts or (retry.code == wire.Code.DRAINING and not self.bounce_off_drain()):
                    self.spend_retry(retry.code, retry.message, retry.node_id)
                else:
                    self.trace.failures.append(f"{retry.code}@{retry.node_id}")
                await asyncio.sleep(retry_delay(retry, self.client.retry_delay_s))

    def bounce_off_drain(self) -> bool:
        """Whether one more `draining` answer may go out again without spending a retry."""
        self.num_drain_bounces += 1
        return self.num_drain_bounces <= MAX_DRAIN_BOUNCES

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

    def _finish(self) -> None:
        self.trace.timings["total_s"] = round(time.monotonic() - self._started_at, 6)
        ids = [t.token_id for t in self.tokens]
        usage = {"prompt_tokens": len(self.prompt), "completion_tokens": len(ids),
                 "cached_tokens": self.trace.num_cached_tokens}
        self.result = GenerationResult(self.request_id, self.session_id, ids, "".join(t.text for t in self.tokens),
                                       self.finish_reason, usage, self.trace, tuple(self.tokens),
                                       self.prompt_logprobs)
