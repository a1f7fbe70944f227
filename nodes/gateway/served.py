"""One request being served, whatever the transport (SSE, JSON or WebSocket): admission (rate
limits, in-flight gauge), the relay from the cluster, token timing, metrics and the access log.

Contract: `async with Served(gateway, endpoint, identity, prefix, tenant) as served:` admits
(ApiError 429) and always logs one `access` line and counts the outcome on exit;
`served.start(api_request)` starts the cluster request behind a `Relay`, on the cluster session
`tenants.cluster_session_id(tenant, session id)` (the client's session id, or a new one), and one
more for each other choice (prompts x `n`: choice i > 0 is request `<id>-i` on session
`<session>~i`, sampled with seed + its sample number); `async for token in served.tokens(i)`
yields choice i's StreamTokens, `served.merged()` every choice's `(i, token)` as they come
(ClusterError / StalledConsumer propagate);
`served.info()` is the `pdbus` object, which names the client's own session id, never the
cluster's. Whatever the ending, `__aexit__` aborts the cluster request and releases the limits.
`cluster_error(exc) -> ApiError` maps the cluster's refusals: `overloaded` -> 503 + Retry-After,
`rejected`/`bad_request` -> 400, anything else -> 503. `outcome_of(exc) -> Outcome`: how a request
ended, the `outcome` label of `pdbus_requests_total` and of the access log.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bus.log import get_logger
from nodes.cluster import ClusterError
from nodes.gateway.api_errors import ApiError
from nodes.gateway.arrival_ledger import Arrival
from nodes.gateway.openai_format import pdbus_info
from nodes.gateway.relay import Relay, StalledConsumer
from nodes.gateway.tenants import cluster_session_id, new_session_id
from nodes.wire import Code

if TYPE_CHECKING:   # app.py imports this module
    from nodes.gateway.app import Gateway

BAD_INPUT_CODES = {Code.REJECTED, Code.BAD_REQUEST, Code.MALFORMED, Code.OVERSIZED}
GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway")   # the app's `Gateway` (nodes/gateway/app.py)
IDENTITY = web.RequestKey("identity", str)   # who the rate limits count: the key's tenant or client address
TENANT = web.RequestKey("tenant", str)       # whose sessions: tenants.tenant_of(API key), "" without keys
log = get_logger("gateway")


class Outcome(StrEnum):
    OK = "ok"
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    STALLED = "stalled"          # the consumer stopped reading
    CANCELLED = "cancelled"      # the client went away
    ERROR = "error"


# Endings that say how the cluster served (the SLO ledger counts them); the others are the client's.
CLUSTER_OUTCOMES = frozenset((Outcome.OK, Outcome.OVERLOADED, Outcome.UNAVAILABLE, Outcome.ERROR))
_OUTCOME_OF_STATUS = {400: Outcome.BAD_REQUEST, 401: Outcome.UNAUTHORIZED, 404: Outcome.BAD_REQUEST,
                      413: Outcome.BAD_REQUEST, 429: Outcome.RATE_LIMITED, 503: Outcome.UNAVAILABLE}


def cluster_error(exc: ClusterError) -> ApiError:
    if exc.code == Code.OVERLOADED:
        retry_after = max(1, math.ceil(float(exc.details.get("retry_after_s") or 1.0)))
        return ApiError(503, f"the cluster is overloaded; retry after {retry_after}s", code=Code.OVERLOADED,
                        headers={"Retry-After": str(retry_after)})
    if exc.code in BAD_INPUT_CODES:
        return ApiError(400, f"the cluster refused the request: {exc.message}", code=exc.code)
    return ApiError(503, f"the cluster could not serve the request ({exc.code}): {exc.message}", code=exc.code,
                    headers={"Retry-After": "1"})


def outcome_of(exc: BaseException | None) -> Outcome:
    if exc is None:
        return Outcome.OK
    if isinstance(exc, ApiError):
        if exc.status == 503 and exc.code == Code.OVERLOADED:
            return Outcome.OVERLOADED
        return _OUTCOME_OF_STATUS.get(exc.status, Outcome.ERROR)
    if isinstance(exc, StalledConsumer):
        return Outcome.STALLED
    if isinstance(exc, asyncio.CancelledError | ConnectionError):
        return Outcome.CANCELLED
    if isinstance(exc, ClusterError):
        return outcome_of(cluster_error(exc))
    return Outcome.ERROR


class Served:
    def __init__(self, gateway: Gateway, endpoint: str, identity: str, prefix: str = "cmpl", tenant: str = "") -> None:
        self.gateway, self.endpoint, self.identity, self.tenant = gateway, endpoint, identity, tenant
        self.request_id = f"{prefix}-{uuid.uuid4().hex}"
        self.session_id: str | None = None
        self.relays: list[Relay] = []            # one per choice: prompt p's sample k is choice p * n + k
        self.api_request: Any = None
        self.token_times: list[float] = []       # choice 0's (TTFT and the access log)
        self.choice_times: dict[int, list[float]] = {}
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.arrival: Arrival | None = None      # in the gateway's ledger of SLO outcomes by arrival
        self._admitted = False

    async def __aenter__(self) -> Served:
        try:
            self.gateway.limiter.acquire(self.identity, time.monotonic())
        except ApiError as exc:   # refused: still counted and logged
            self.finish(exc)
            raise
        self._admitted = True
        self.gateway.metrics.in_flight.inc()
        self.arrival = self.gateway.arrivals.arrived(self.started)
        return self

    @property
    def relay(self) -> Relay | None:
        return self.relays[0] if self.relays else None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        for relay in self.relays:
            await relay.aclose()   # no-op when finished; aborts the cluster request otherwise
        if self._admitted:
            self.gateway.limiter.release(self.identity)
            self.gateway.metrics.in_flight.dec()
        self.finish(exc)

    def finish(self, exc: BaseException | None) -> None:
        if self.outcome is not None:
            return
        ended_early = exc is None and self.relay is not None and not self.relay.result
        self.outcome = Outcome.CANCELLED if ended_early else outcome_of(exc)
        ended = time.monotonic()
        self.gateway.metrics.observe_request(self.endpoint, self.outcome)
        if self.arrival is not None:
            self.arrival.end(ended, counted=self.outcome in CLUSTER_OUTCOMES, served=self.outcome is Outcome.OK)
        result = self.relay.result if self.relay is not None else None
        for index, relay in enumerate(self.relays):
            times = self.token_times if index == 0 else self.choice_times.get(index, [])
            usage = relay.result.usage if relay.result else {"prompt_tokens": len(relay.generation.prompt),
                                                             "completion_tokens": len(times)}
            self.gateway.metrics.observe_stream(relay.generation.trace, usage, times, self.started, ended)
        self._log_access(exc, result, ended)

    def _log_access(self, exc: BaseException | None, result: Any, ended: float) -> None:
        info = self.info() if self.relay is not None else {}
        log.info("access", endpoint=self.endpoint, outcome=self.outcome, request_id=self.request_id,
                 session_id=info.get("session_id"), prefill_node=info.get("prefill_node"),
                 decode_node=info.get("decode_node"), failover=info.get("failover"),
                 num_tokens=len(self.token_times), finish_reason=result.finish_reason if result else None,
                 duration_s=round(ended - self.started, 6),
                 ttft_s=round(self.token_times[0] - self.started, 6) if self.token_times else None,
                 error=(getattr(exc, "message", None) or repr(exc))[:300] if exc is not None else None,
                 status=getattr(exc, "status", None))

    def start(self, api_request: Any) -> None:
        self.api_request = api_request
        config = self.gateway.config
        self.session_id = api_request.session_id or new_session_id()
        # Prefix caches are shared within a tenant only, unless the operator lets tenants share them.
        salt = "" if config.share_prefix_cache else self.tenant
        session = cluster_session_id(self.tenant, self.session_id)
        for prompt in range(api_request.num_prompts):
            first = prompt * api_request.samples
            # The samples of a prompt: one group, routed by its first one's session, so the others
            # may decode from the KV its prefill sends (one prefill, one transfer).
            fork = (f"{self.request_id}/{prompt}", session if first == 0 else f"{session}~{first}") \
                if api_request.samples > 1 else ("", "")
            for sample in range(api_request.samples):
                index = first + sample
                # Choice 0 is the request itself; the others run beside it as cluster requests of their own.
                generation = self.gateway.backend.start_generation(
                    api_request.prompt_item(prompt), self.request_id if index == 0 else f"{self.request_id}-{index}",
                    session if index == 0 else f"{session}~{index}", salt, choice=sample, fork=fork)
                self.relays.append(Relay(generation, config.stream_buffer_tokens, config.stall_timeout_s))
                self.gateway.relays.add(self.relays[-1])

    async def tokens(self, index: int = 0) -> Any:
        """Choice `index`'s tokens as they come."""
        assert self.relays, "start() the request first"
        times = self.token_times if index == 0 else self.choice_times.setdefault(index, [])
        async for token in self.relays[index]:
            times.append(time.monotonic())
            if index == 0 and self.arrival is not None:
                self.arrival.token(times[-1])
            yield token

    async def merged(self) -> Any:
        """Every choice's tokens as `(index, token)` in the order they come; ends when all have."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for token in self.tokens(index):
                    queue.put_nowait((index, token))
                queue.put_nowait((index, None))
            except BaseException as exc:   # ClusterError, StalledConsumer: the consumer re-raises it
                queue.put_nowait((index, exc))

        pumps = [asyncio.get_running_loop().create_task(pump(i)) for i in range(len(self.relays))]
        try:
            for _ in range(len(pumps)):
                while True:
                    index, item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    yield index, item
        finally:
            for task in pumps:
                task.cancel()

    def info(self) -> dict[str, Any]:
        assert self.relay is not None, "start() the request first"
        return pdbus_info(self.relay.generation.trace, self.gateway.config.kv_mode, session_id=self.session_id)

    @property
    def result(self) -> Any:
        return self.relay.result if self.relay is not None else None
