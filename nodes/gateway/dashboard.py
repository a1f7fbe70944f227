"""The live cluster page: `GET /dashboard`, `GET /dashboard/events` (SSE), `GET /dashboard/snapshot`.

Contract: `install(app, gateway)` (from `build_app`) adds the three routes and a `DashboardFeed` at
`app[DASHBOARD]`, and makes the feed's window one of `gateway.metrics.observers`, so every request
the metrics record also reaches the page (dashboard_data.DashboardWindow). The routes sit behind
the app's `auth` middleware like /v1/*: with `[gateway] api_keys` set they need the key, as a
Bearer header or as `?api_key=` (an EventSource cannot send headers); the key is never logged.
- `/dashboard`: one HTML page (static/dashboard.html with its script, its style and the vendored
  uPlot inlined, so a key given in the query opens the whole page with one authorised request).
- `/dashboard/events`: `text/event-stream`; an `event: snapshot` with the window's JSON snapshot
  about every `interval_s` (docs/API.md, "Dashboard"), at most `MAX_VIEWERS` at once (503 past
  that); a viewer that does not read for `stall_timeout_s` is cut off, as token streams are.
- `/dashboard/snapshot`: the same snapshot once, as JSON (curl, tests).
One sampler task per gateway asks the broker for its stats (the same `pdbus.broker.stats` request
as /metrics) once per `interval_s`, and only while a page is open: the cost on the broker is one
tiny request a second whatever the number of viewers, and none without any.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bus.log import get_logger
from nodes.gateway.api_errors import ApiError
from nodes.gateway.dashboard_data import DashboardWindow
from nodes.gateway.relay import within

if TYPE_CHECKING:   # app.py imports this module
    from nodes.gateway.app import Gateway

MAX_VIEWERS = 32
INTERVAL_S = 1.0
_END: dict[str, Any] = {}   # handed to each viewer when the gateway shuts down
log = get_logger("gateway")


class WindowObserver:
    """What GatewayMetrics tells its observers, passed on to the window with the clock's `now`. A
    bug in the dashboard must never fail a request: it is logged and the request goes on."""

    def __init__(self, window: DashboardWindow) -> None:
        self.window = window

    def observe_request(self, endpoint: str, outcome: str) -> None:
        try:
            self.window.observe_request(endpoint, outcome, time.monotonic())
        except Exception:
            log.exception("dashboard_observe_failed", what="request")

    def observe_stream(self, trace: Any, usage: dict[str, int], token_times: list[float], started: float,
                       ended: float) -> None:
        try:
            self.window.observe_stream(trace, usage, token_times, started, ended)
        except Exception:
            log.exception("dashboard_observe_failed", what="stream")


class DashboardFeed:
    """The window, and the snapshots handed to whoever watches it (each viewer an inbox of one:
    a slow viewer gets the latest snapshot, never a backlog)."""

    def __init__(self, gateway: Gateway, interval_s: float = INTERVAL_S) -> None:
        self.gateway, self.interval_s = gateway, interval_s
        self.window = DashboardWindow()
        self.viewers: set[asyncio.Queue] = set()
        self.latest: tuple[float, dict[str, Any]] | None = None
        self._sampler: asyncio.Task | None = None
        self._closed = False

    async def sample(self) -> dict[str, Any]:
        stats = await self.gateway.backend.broker_stats()
        now = time.monotonic()
        self.window.observe_broker(stats, now)
        snapshot = self.window.snapshot(now, time.time())
        in_flight = list(self.gateway.metrics.in_flight.collect())[0].samples[0].value
        snapshot["gateway"] = {"node_id": self.gateway.node_id, "in_flight": int(in_flight),
                               "model": self.gateway.config.model_name}
        self.latest = (now, snapshot)
        return snapshot

    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Queue]:
        inbox: asyncio.Queue = asyncio.Queue(maxsize=1)
        if self.latest is not None and time.monotonic() - self.latest[0] < 2 * self.interval_s:
            inbox.put_nowait(self.latest[1])   # a new viewer sees something at once
        self.viewers.add(inbox)
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._run())
        try:
            yield inbox
        finally:
            self.viewers.discard(inbox)

    async def _run(self) -> None:
        while self.viewers and not self._closed:
            started = time.monotonic()
            try:
                snapshot = await self.sample()
            except Exception:   # a bug here must not end the page: log it, try again next tick
                log.exception("dashboard_sample_failed")
            else:
                for inbox in list(self.viewers):
                    _replace(inbox, snapshot)
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        """End every viewer's stream (on shutdown: aiohttp would otherwise wait for them)."""
        self._closed = True
        for inbox in list(self.viewers):
            _replace(inbox, _END)
        if self._sampler is not None:
            self._sampler.cancel()


def _replace(inbox: asyncio.Queue, item: dict[str, Any]) -> None:
    with contextlib.suppress(asyncio.QueueEmpty):
        inbox.get_nowait()
    inbox.put_nowait(item)


DASHBOARD: web.AppKey[DashboardFeed] = web.AppKey("dashboard", DashboardFeed)
STATIC = resources.files("nodes.gateway") / "static"
_PAGE: list[bytes] = []   # the assembled page, read once


def page_html() -> bytes:
    """static/dashboard.html with its assets inlined (what `/*ASSET:name*/` marks)."""
    if not _PAGE:
        html = (STATIC / "dashboard.html").read_text(encoding="utf-8")
        for name in ("uPlot.min.css", "dashboard.css", "uPlot.iife.min.js", "dashboard.js"):
            html = html.replace(f"/*ASSET:{name}*/", (STATIC / name).read_text(encoding="utf-8"))
        _PAGE.append(html.encode())
    return _PAGE[0]


# The page holds no secret, but it must not be framed by another site nor leak its URL (which may
# carry the key) in a Referer.
PAGE_HEADERS = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store",
                "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}


async def page(request: web.Request) -> web.Response:
    return web.Response(body=page_html(), headers=PAGE_HEADERS)


async def snapshot(request: web.Request) -> web.Response:
    feed = request.app[DASHBOARD]
    return web.json_response(await feed.sample(), headers={"Cache-Control": "no-store"})


def sse_event(data: dict[str, Any]) -> bytes:
    return b"event: snapshot\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def events(request: web.Request) -> web.StreamResponse:
    feed = request.app[DASHBOARD]
    if len(feed.viewers) >= MAX_VIEWERS:
        raise ApiError(503, f"at most {MAX_VIEWERS} dashboards may watch one gateway", headers={"Retry-After": "5"})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "Referrer-Policy": "no-referrer"})
    await response.prepare(request)
    timeout = feed.gateway.config.stall_timeout_s
    try:
        with feed.watch() as inbox:
            await within(timeout, response.write(b"retry: 2000\n\n"))   # EventSource reconnects after 2 s
            while (item := await inbox.get()) is not _END:
                await within(timeout, response.write(sse_event(item)))
    except TimeoutError:   # the viewer stopped reading: cut it off, as a stalled token stream is
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


def install(app: web.Application, gateway: Gateway) -> None:
    feed = DashboardFeed(gateway)
    app[DASHBOARD] = feed
    gateway.metrics.observers.append(WindowObserver(feed.window))

    async def close(_: web.Application) -> None:
        feed.close()

    app.on_shutdown.append(close)
    app.add_routes([web.get("/dashboard", page), web.get("/dashboard/events", events),
                    web.get("/dashboard/snapshot", snapshot)])
