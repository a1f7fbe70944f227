"""`GET /v1/stream`: token streaming over a WebSocket (message schema in docs/API.md).

Contract: the client sends a JSON request, the same fields as `/v1/completions` (`prompt`) or
`/v1/chat/completions` (`messages`); the server answers one `{"type": "token", "index", "text",
"token_id"}` message per token, then `{"type": "done", "finish_reason", "usage", "timings",
"pdbus"}`; or `{"type": "error", "error": {...OpenAI error..., "status"}}`. The client may send
`{"type": "cancel"}` at any time: the cluster request is aborted and `done` comes with
`finish_reason` "abort". One request at a time per socket; after `done` (or `error`) the next
may be sent on the same socket (a chat keeps its `session_id`). Every request gets an answer:
its stream, or an `error` (bad JSON, input the bus cannot carry, a bug: 500), never silence.
Closing the socket aborts the request in flight. API keys: `Authorization: Bearer` header or
`?api_key=` (browsers cannot set headers on a WebSocket); the key scopes the sessions as on
HTTP. A client that stops reading is cut off after `stall_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import WSMsgType, web

from bus.log import get_logger
from nodes.cluster import ClusterError
from nodes.gateway.api_errors import ApiError, bad_request
from nodes.gateway.http import parse_json
from nodes.gateway.openai_format import usage_body
from nodes.gateway.relay import StalledConsumer, within
from nodes.gateway.schema import parse_request
from nodes.gateway.served import GATEWAY, IDENTITY, TENANT, Served, cluster_error

log = get_logger("gateway")


async def stream(request: web.Request) -> web.WebSocketResponse:
    gateway = request.app[GATEWAY]
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=gateway.config.max_body_bytes)
    await ws.prepare(request)
    current: asyncio.Task | None = None
    try:
        async for message in ws:
            current = await _on_message(ws, request, message, current)
    finally:
        if current is not None and not current.done():
            current.cancel()   # the socket closed: abort the request in flight
            with contextlib.suppress(BaseException):
                await current
    return ws


async def _on_message(ws: web.WebSocketResponse, request: web.Request, message: Any,
                      current: asyncio.Task | None) -> asyncio.Task | None:
    """Start serving a request, cancel the one in flight, or answer an `error`: every message
    the client sends gets an answer. Returns the request task now in flight (if any)."""
    timeout = request.app[GATEWAY].config.stall_timeout_s
    busy = current is not None and not current.done()
    if message.type != WSMsgType.TEXT:
        await _send_error(ws, bad_request("send JSON text messages"), timeout)
        return current
    body = _parse(message.data)
    if isinstance(body, dict) and body.get("type") == "cancel":
        if busy and current is not None:
            current.cancel()
        return current
    if busy:
        await _send_error(ws, bad_request("one request at a time: wait for 'done' or send a cancel"), timeout)
        return current
    return asyncio.create_task(_serve(ws, request, body))


def _parse(data: str) -> object:
    try:
        return parse_json(data, "message")
    except ApiError as exc:
        return exc


async def _send(ws: web.WebSocketResponse, data: dict, timeout: float) -> None:
    await within(timeout, ws.send_str(json.dumps(data, ensure_ascii=False)))


async def _send_error(ws: web.WebSocketResponse, error: ApiError, timeout: float) -> None:
    body = error.body()
    body["error"]["status"] = error.status
    # ASCII escapes: an error may quote client input, and its frame must always encode.
    with contextlib.suppress(ConnectionError, TimeoutError, RuntimeError):
        await within(timeout, ws.send_str(json.dumps({"type": "error", **body})))


async def _serve(ws: web.WebSocketResponse, request: web.Request, body: object) -> None:
    gateway = request.app[GATEWAY]
    config = gateway.config
    timeout = config.stall_timeout_s
    chat = isinstance(body, dict) and "messages" in body
    served: Served | None = None
    try:
        async with Served(gateway, "websocket", request[IDENTITY], "ws", request[TENANT]) as served:
            if isinstance(body, ApiError):
                raise body
            api = parse_request(body, chat=chat, model_name=config.model_name,
                                max_tokens_limit=config.max_tokens_limit,
                                session_header=request.headers.get("X-Session-Id"))
            if api.num_prompts * api.n > 1 or api.echo or api.logprobs is not None:
                raise ApiError(400, "the WebSocket stream serves one choice of text: n, several prompts, echo and "
                               "logprobs are served over HTTP", param="n")
            served.start(api)
            await _relay(ws, served, timeout)
    except ApiError as exc:
        await _send_error(ws, exc, timeout)
    except ClusterError as exc:
        await _send_error(ws, cluster_error(exc), timeout)
    except (StalledConsumer, TimeoutError):
        await ws.close(code=1008, message=b"stalled consumer")
    except asyncio.CancelledError:
        if served is not None:
            with contextlib.suppress(Exception):
                await _send(ws, _done(served, "abort"), timeout)
    except Exception:   # a bug: the client still gets an answer, the stack trace stays in the log
        log.exception("internal_error", path=request.path)
        await _send_error(ws, ApiError(500, "internal error (logged on the gateway)"), timeout)


async def _relay(ws: web.WebSocketResponse, served: Served, timeout: float) -> None:
    async for token in served.tokens():
        await _send(ws, {"type": "token", "index": token.index, "text": token.text, "token_id": token.token_id},
                    timeout)
    await _send(ws, _done(served, served.result.finish_reason), timeout)


def _done(served: Served, finish_reason: str | None) -> dict:
    result = served.result
    times = served.token_times
    usage = result.usage if result else {"prompt_tokens": len(served.relay.generation.prompt) if served.relay else 0,
                                         "completion_tokens": len(times)}
    ttft = times[0] - served.started if times else None
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else None
    timings = {"ttft_s": round(ttft, 6) if ttft is not None else None,
               "total_s": round(time.monotonic() - served.started, 6),
               "tokens_per_s": round(rate, 2) if rate else None}
    return {"type": "done", "id": served.request_id, "finish_reason": finish_reason, "usage": usage_body(usage),
            "timings": timings, "pdbus": served.info() if served.relay else None}
