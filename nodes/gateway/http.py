"""HTTP handlers: `POST /v1/completions`, `POST /v1/chat/completions` (JSON or SSE), `GET /v1/models`,
`GET /health`, `GET /ready`, `GET /metrics`, `GET /slo/arrivals` (SLO outcomes by second of arrival, for
the planner: `ttft_s`, `tpot_s` targets in the query, each within [0, 3600], else 400).

Contract: each handler takes an aiohttp request whose app holds the `Gateway` (app[GATEWAY]) and
whose `request[IDENTITY]` the auth middleware set; errors are raised as `ApiError` and rendered
by the app's middleware. Streaming sends its headers when the first token is ready, so a request
the cluster refuses (overloaded, rejected) still gets a real HTTP status; `X-Pdbus-Decode-Node` is
then known, the rest of what served the request is in the last chunk's `pdbus` object. SSE chunks
follow OpenAI (`data: {...}` then `data: [DONE]`; with `stream_options.include_usage` a last
chunk with empty `choices` and the usage). Several choices (`n`, prompt batches, `best_of`) are
one cluster request each (nodes/gateway/served.py): a JSON response lists them (with `best_of`,
the n of highest total logprob), a stream interleaves their chunks by `index` and ends each with
its own final chunk; text, logprobs, echo and tool calls are shaped by nodes/gateway/choices.py,
and a stream's content ordered by nodes/gateway/stream_order.py (an echo before its tokens). A
client that disconnects cancels the handler (aiohttp `handler_cancellation`), which aborts the
cluster request; a client that stops reading is cut off after `stall_timeout_s`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from aiohttp import web

from bus.log import get_logger
from nodes.cluster import ClusterError
from nodes.gateway.api_errors import ApiError, bad_request, error_body
from nodes.gateway.choices import ChoiceBuilder
from nodes.gateway.openai_format import Choice, Shaper, pdbus_headers
from nodes.gateway.relay import StalledConsumer, within
from nodes.gateway.schema import MAX_DEPTH, parse_request
from nodes.gateway.served import GATEWAY, IDENTITY, TENANT, Served, cluster_error
from nodes.gateway.stream_order import Piece, StreamOrder

log = get_logger("gateway")


async def read_json(request: web.Request, max_bytes: int) -> object:
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"the request body is larger than {max_bytes} bytes")
    try:
        raw = await request.content.read(max_bytes + 1)
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise bad_request(f"could not read the request body: {exc}") from exc
    if len(raw) > max_bytes:
        raise ApiError(413, f"the request body is larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8 (byte {exc.start})") from exc
    return parse_json(text, "request body")


def parse_json(text: str, what: str) -> object:
    """JSON, or a 400: malformed, or nested past the parser's recursion limit (RecursionError,
    which is no ValueError); the schema then holds nesting to MAX_DEPTH."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise bad_request(f"the {what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request(f"the {what} is nested deeper than {MAX_DEPTH} levels") from None


def sse(data: object) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


async def _openai(request: web.Request, chat: bool) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    config = gateway.config
    endpoint = "chat" if chat else "completions"
    async with Served(gateway, endpoint, request[IDENTITY], "chatcmpl" if chat else "cmpl",
                      request[TENANT]) as served:
        body = await read_json(request, config.max_body_bytes)
        api = parse_request(body, chat=chat, model_name=config.model_name, max_tokens_limit=config.max_tokens_limit,
                            session_header=request.headers.get("X-Session-Id"))
        if api.ignored_fields:
            log.info("ignored_fields", request_id=served.request_id, fields=list(api.ignored_fields))
        served.start(api)
        shaper = Shaper(chat, config.model_name, served.request_id, int(time.time()))
        if api.stream:
            return await _stream(request, served, shaper)
        return await _complete(served, shaper)


async def _complete(served: Served, shaper: Shaper) -> web.Response:
    builders = _builders(served)

    async def collect(builder: ChoiceBuilder) -> None:
        async for token in served.tokens(builder.index):
            builder.add(token)
        builder.opening()   # now that the prompt logprobs are in

    try:
        await asyncio.gather(*(collect(b) for b in builders))
    except ClusterError as exc:
        raise cluster_error(exc) from exc
    info = served.info()
    choices = [b.choice(_result(relay).finish_reason) for b, relay in zip(builders, served.relays, strict=True)]
    body = shaper.response_choices(best_choices(choices, served), _usage(served), info)
    return web.json_response(body, headers=pdbus_headers(info), dumps=_dumps)


def _builders(served: Served) -> list[ChoiceBuilder]:
    tokenizer = served.gateway.backend.model.tokenizer
    return [ChoiceBuilder(i, served.api_request.prompt_item(i // served.api_request.samples), relay.generation,
                          tokenizer) for i, relay in enumerate(served.relays)]


def best_choices(choices: list[Choice], served: Served) -> list[Choice]:
    """With `best_of` k > n: each prompt's n samples of highest total logprob (vLLM's ranking),
    numbered again 0.. in that order; otherwise every choice."""
    api = served.api_request
    if api.samples == api.n:
        return choices
    kept: list[Choice] = []
    for prompt in range(api.num_prompts):
        span = range(prompt * api.samples, (prompt + 1) * api.samples)
        ranked = sorted(span, key=lambda i: -_total_logprob(served.relays[i]))[:api.n]
        kept.extend(dataclasses.replace(choices[i], index=len(kept)) for i in ranked)
    return kept


def _total_logprob(relay: Any) -> float:
    return sum(t.logprobs.logprob for t in _result(relay).tokens if t.logprobs is not None)


def _result(relay: Any) -> Any:
    """A finished relay's GenerationResult (set once its stream ended without an error)."""
    assert relay.result is not None, "the choice's stream has not finished"
    return relay.result


def _usage(served: Served) -> dict[str, int]:
    """Each prompt counted once, every choice's completion tokens (none when only scored)."""
    api, usage = served.api_request, {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    for index, relay in enumerate(served.relays):
        result = _result(relay).usage
        if index % api.samples == 0:
            usage["prompt_tokens"] += int(result.get("prompt_tokens", 0))
            usage["cached_tokens"] += int(result.get("cached_tokens", 0))
        if not (api.echo and api.max_tokens == 0):
            usage["completion_tokens"] += int(result.get("completion_tokens", 0))
    return usage


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


async def _stream(request: web.Request, served: Served, shaper: Shaper) -> web.StreamResponse:
    tokens = served.merged()
    try:
        first = await anext(tokens, None)
    except ClusterError as exc:
        raise cluster_error(exc) from exc
    info = served.info()
    headers = {k: v for k, v in pdbus_headers(info).items() if k in ("X-Request-Id", "X-Session-Id",
                                                                      "X-Pdbus-Decode-Node")}
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **headers})
    await response.prepare(request)
    timeout = served.gateway.config.stall_timeout_s
    try:
        await _send_stream(response, served, shaper, tokens, first, timeout)
    except (StalledConsumer, TimeoutError) as exc:
        stalled = exc if isinstance(exc, StalledConsumer) else StalledConsumer(f"a write blocked for {timeout:g}s")
        served.finish(stalled)
        if request.transport is not None:
            request.transport.close()   # cut the stalled client off; the cluster request is aborted on exit
        return response
    except ClusterError as exc:
        error = cluster_error(exc)
        served.finish(exc)
        await within(timeout, response.write(sse(error_body(error.status, error.message, code=error.code))))
        await within(timeout, response.write(b"data: [DONE]\n\n"))
    await response.write_eof()
    return response


async def _send_stream(response: web.StreamResponse, served: Served, shaper: Shaper, tokens, first, timeout: float
                       ) -> None:
    async def send(data: object) -> None:
        await within(timeout, response.write(sse(data)))

    async def send_content(pieces: list[Piece]) -> None:
        for index, text, logprobs in pieces:
            await send(shaper.chunk(text, index, logprobs))

    builders = _builders(served)
    order = StreamOrder(builders)
    for builder in builders:
        if (opening := shaper.first_chunk(builder.index)) is not None:
            await send(opening)
        await send_content(order.start(builder.index))
    pending = [] if first is None else [first]
    async for index, token in _chain(pending, tokens):
        await send_content(order.token(index, token))
    await send_content(order.ended())
    for builder, relay in zip(builders, served.relays, strict=True):
        choice = builder.choice(_result(relay).finish_reason)
        if builder.holds_text and (choice.text or choice.tool_calls):
            await send(shaper.tool_chunk(choice))
        await send(shaper.final_chunk(choice.finish_reason, served.info(), index=builder.index))
    if served.api_request.include_usage:
        await send(shaper.usage_chunk(_usage(served)))
    await within(timeout, response.write(b"data: [DONE]\n\n"))


async def _chain(first: list, rest):
    for item in first:
        yield item
    async for item in rest:
        yield item


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return web.json_response({"object": "list", "data": [{
        "id": gateway.config.model_name, "object": "model", "created": gateway.created, "owned_by": "pdbus",
        "max_model_len": gateway.backend.max_model_len}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    state = await gateway.backend.readiness()
    gateway.metrics.set_services(state["services"])
    return web.json_response(state, status=200 if state["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    gateway.metrics.set_broker_stats(await gateway.backend.broker_stats())
    body, content_type = gateway.metrics.render()
    return web.Response(body=body, headers={"Content-Type": content_type})


MAX_SLO_TARGET_S = 3600.0


def _slo_target(request: web.Request, name: str) -> float:
    """A target in seconds from the query (absent: 0, not checked)."""
    try:
        value = float(request.query.get(name, "0"))
    except ValueError:
        raise bad_request(f"{name} must be a number of seconds", param=name) from None
    if not 0 <= value <= MAX_SLO_TARGET_S:   # NaN fails this too
        raise bad_request(f"{name} must be within [0, {MAX_SLO_TARGET_S:g}] seconds", param=name)
    return value


async def slo_arrivals(request: web.Request) -> web.Response:
    """SLO outcomes per second of arrival (docs/API.md; nodes/gateway/arrival_ledger.py)."""
    gateway = request.app[GATEWAY]
    ttft_s, tpot_s = _slo_target(request, "ttft_s"), _slo_target(request, "tpot_s")
    now = time.monotonic()
    seconds = gateway.arrivals.outcomes(now, ttft_s, tpot_s)
    return web.json_response({"now": now, "window_s": gateway.arrivals.window_s,
                              "seconds": [[s.second, s.within, s.missed, s.pending, s.credit] for s in seconds]})
