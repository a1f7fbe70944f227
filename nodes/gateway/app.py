"""The gateway's aiohttp application and its lifecycle.

Contract:
- `Gateway(config, backend, limiter=None, node_id="")` holds what handlers share: config, backend,
  metrics, the rate limiter (`protect.RateLimiter` unless given one: a worker of several passes
  `shared_limits.SharedRateLimiter`), the live relays (for the buffered-tokens gauge), start time,
  and its bus node id, which every response names in `X-Pdbus-Gateway` (which worker served it).
- `build_app(gateway) -> web.Application`: routes (docs/API.md) and two middlewares: `errors`
  (ApiError -> OpenAI error JSON with its status and headers; aiohttp's HTTP errors in the same
  shape; anything unexpected -> 500 with no stack trace in the body, logged) and `auth` (Bearer
  API key on /v1/*, 401; sets `request[TENANT]`, the key's tenant tag that scopes its sessions
  (nodes/gateway/tenants.py; "" without keys), and `request[IDENTITY]` for rate limiting: the
  tenant, or the client address when no keys are configured; a refusal is counted under a fixed
  endpoint label, never the path).
- `runner_options(config) -> dict`: the `AppRunner` options: handler cancellation, no access log
  (the gateway writes its own), header limits, and `http_log.server_logger()` (a malformed HTTP
  request is one short throttled line, not a traceback).
- `listening_socket(config, reuse_port=False)`: the server socket (SO_REUSEPORT for a worker).
- `run_gateway(config, client, model, seat=None)`: serves with the started bus client until
  SIGINT/SIGTERM, then closes the HTTP server and the bus client. Alone (`seat` None) it logs
  `gateway_started`; as worker `seat` of `pdbus gateway --workers N` (nodes/gateway/workers.py) it
  listens with SO_REUSEPORT beside its siblings, counts limits in the parent's shared table, logs
  `gateway_worker_started` and tells the parent it serves (the parent logs `gateway_started`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
import weakref
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bus.log import get_logger
from nodes.config_file import SettingsError
from nodes.gateway import dashboard, http, http_log, websocket
from nodes.gateway.api_errors import ApiError, error_body
from nodes.gateway.arrival_ledger import ArrivalLedger
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_metrics import GatewayMetrics
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.gateway.protect import Limiter, RateLimiter, check_api_key
from nodes.gateway.served import GATEWAY, IDENTITY, TENANT
from nodes.gateway.tenants import tenant_of
from nodes.heap import freeze_startup_objects

if TYPE_CHECKING:   # a worker's seat is handed in, never made here
    from nodes.gateway.workers import WorkerSeat

log = get_logger("gateway")
OPEN_PATHS = ("/health", "/ready", "/metrics", "/slo/arrivals")
ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat", "/v1/stream": "websocket",
             "/v1/models": "models"}


class Gateway:
    def __init__(self, config: GatewayConfig, backend: Backend, limiter: Limiter | None = None,
                 node_id: str = "") -> None:
        self.config, self.backend, self.node_id = config, backend, node_id
        self.metrics = GatewayMetrics()
        self.arrivals = ArrivalLedger()
        self.limiter: Limiter = limiter or RateLimiter(config.rate_limit_rps, config.rate_limit_burst,
                                                       config.max_streams_per_key)
        self.relays: weakref.WeakSet = weakref.WeakSet()
        self.created = int(time.time())
        self.metrics.buffered.set_function(lambda: sum(r.queue.qsize() for r in list(self.relays)))


def _error_response(error: ApiError) -> web.Response:
    return web.json_response(error.body(), status=error.status, headers=error.headers)


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(error_body(exc.status, exc.reason or "error"), status=exc.status,
                                 headers={k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")})
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("internal_error", path=request.path)
        return web.json_response(error_body(500, "internal error (logged on the gateway)"), status=500)


@web.middleware
async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
    config = request.app[GATEWAY].config
    request[TENANT] = ""
    if request.path in OPEN_PATHS or not config.api_keys:
        request[IDENTITY] = request.remote or "local"
    else:
        header = request.headers.get("Authorization")
        if header is None and "api_key" in request.query:
            header = f"Bearer {request.query['api_key']}"
        try:
            request[TENANT] = tenant_of(check_api_key(header, config.api_keys))
        except ApiError:
            # A fixed set of labels: a client-chosen path must never become a metric series.
            request.app[GATEWAY].metrics.observe_request(ENDPOINTS.get(request.path, "other"), "unauthorized")
            raise
        request[IDENTITY] = "key:" + request[TENANT]   # the limiter never holds the key itself
    return await handler(request)


async def name_the_gateway(request: web.Request, response: web.StreamResponse) -> None:
    # Every response, errors and WebSocket handshakes included: with several workers behind one
    # port this is how a client (or a test) tells which one answered.
    response.headers["X-Pdbus-Gateway"] = request.app[GATEWAY].node_id


def build_app(gateway: Gateway) -> web.Application:
    app = web.Application(middlewares=[errors, auth], client_max_size=gateway.config.max_body_bytes)
    app[GATEWAY] = gateway
    if gateway.node_id:
        app.on_response_prepare.append(name_the_gateway)
    app.add_routes([
        web.post("/v1/completions", http.completions), web.post("/v1/chat/completions", http.chat_completions),
        web.get("/v1/models", http.models), web.get("/v1/stream", websocket.stream),
        web.get("/health", http.health), web.get("/ready", http.ready), web.get("/metrics", http.metrics),
        web.get("/slo/arrivals", http.slo_arrivals)])
    dashboard.install(app, gateway)   # /dashboard, /dashboard/events, /dashboard/snapshot
    return app


def listening_socket(config: GatewayConfig, reuse_port: bool = False) -> socket.socket:
    """The server socket; accepted connections inherit its send buffer size. A fixed size turns
    off the kernel's send-buffer autotuning (up to tcp_wmem's 4 MiB), which would otherwise let a
    client that stops reading pin megabytes before the gateway's own stall timer can see it.
    `reuse_port`: one of several workers' sockets on one port; the kernel spreads connections."""
    sock = socket.create_server((config.host, config.port), reuse_port=reuse_port)
    if config.send_buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.send_buffer_bytes)
    return sock


def tls_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """The server's TLS context (TLS 1.2+), or None for plain HTTP; bad files fail at start."""
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"[gateway] cannot load tls_cert/tls_key: {exc}") from exc
    return context


def runner_options(config: GatewayConfig) -> dict[str, Any]:
    # Header limits bound what aiohttp buffers before a handler runs (400 past them).
    return {"handler_cancellation": True, "access_log": None, "max_line_size": config.max_header_bytes,
            "max_field_size": config.max_header_bytes, "max_headers": config.max_headers,
            "logger": http_log.server_logger()}


async def serve(gateway: Gateway, stop: asyncio.Event, seat: WorkerSeat | None = None) -> None:
    config = gateway.config
    tls = tls_context(config)
    runner = web.AppRunner(build_app(gateway), **runner_options(config))
    await runner.setup()
    sock = listening_socket(config, reuse_port=seat is not None)
    await web.SockSite(runner, sock, ssl_context=tls).start()
    port = sock.getsockname()[1]
    scheme = "https" if tls else "http"
    fields = {"host": config.host, "port": port, "url": f"{scheme}://{config.host}:{port}", "tls": bool(tls),
              "model": gateway.config.model_name, "max_model_len": gateway.backend.max_model_len,
              "auth": bool(gateway.config.api_keys)}
    if seat is None:
        log.info("gateway_started", **fields)
    else:
        log.info("gateway_worker_started", worker=seat.index, node_id=gateway.node_id, pid=os.getpid(), **fields)
        seat.announce_ready()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run_gateway(config: GatewayConfig, client: Any, model: ModelInfo, seat: WorkerSeat | None = None) -> None:
    """Serve on this thread (uvloop) until SIGINT/SIGTERM; `client` is a started ClusterClient."""
    import signal

    import uvloop

    async def main() -> None:
        stop = asyncio.Event()
        for number in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(number, stop.set)
        freeze_startup_objects()   # the tokenizer lives as long as the process (nodes.heap)
        limiter = seat.limiter(config) if seat is not None else None
        gateway = Gateway(config, Backend(client, model, config), limiter, client.bus.node_id)
        try:
            await serve(gateway, stop, seat)
        finally:
            await asyncio.to_thread(client.close)
        log.info("gateway_stopped")

    uvloop.run(main())
