"""The dashboard's routes in process (aiohttp test server, the fake cluster client of test_app.py and a
canned broker stats answer): the page with its assets inlined, snapshots that show the broker's
nodes and the gateway's own requests, the SSE stream, the API key (401 without, 200 with it as a
header or `?api_key=`, never logged), the cap on viewers, and a shutdown that ends open streams."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway import dashboard
from nodes.gateway.app import Gateway, build_app
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from tests.nodes.gateway.test_app import BODY, FakeClient

KEY = "sk-dashboard-secret-0123456789"
STATS = {"nodes_by_role": {"prefill": 1, "decode": 1, "gateway": 1}, "queued_by_service": {"decode": 0},
         "num_routes": 0, "role_by_node": {"decode-0": "decode", "prefill-0": "prefill"},
         "capacity_by_node": {"decode-0": {"kv_blocks_total": 64, "kv_blocks_free": 48, "num_running": 2,
                                           "max_running": 16},
                              "prefill-0": {"queued_tokens": 0, "prompt_tokens": 10, "prefix_cached_tokens": 5}}}


async def start(api_keys: tuple[str, ...] = (), stats: dict | None = STATS) -> tuple[TestClient, Gateway]:
    config = GatewayConfig(model_name="m", stall_timeout_s=1.0, api_keys=api_keys)
    gateway = Gateway(config, Backend(FakeClient(), ModelInfo(tiny_tokenizer(512), 2048), config), node_id="gw-0")

    async def broker_stats() -> dict | None:
        return stats

    gateway.backend.broker_stats = broker_stats   # type: ignore[method-assign]
    client = TestClient(TestServer(build_app(gateway)))
    await client.start_server()
    client.app[dashboard.DASHBOARD].interval_s = 0.1
    return client, gateway


@pytest.fixture
async def app_client():
    client, gateway = await start()
    yield client, gateway
    await client.close()


async def read_events(response, count: int) -> list[dict]:
    found, buffer = [], b""
    async with asyncio.timeout(5):
        while len(found) < count:
            buffer += await response.content.readany()
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                lines = block.decode().split("\n")
                if "event: snapshot" in lines:
                    found.append(json.loads(next(line[6:] for line in lines if line.startswith("data: "))))
    return found


async def test_the_page_is_one_document_with_its_assets_inlined(app_client):
    client, _ = app_client
    response = await client.get("/dashboard")
    html = await response.text()
    assert response.status == 200 and response.content_type == "text/html"
    assert response.headers["Referrer-Policy"] == "no-referrer" and response.headers["Cache-Control"] == "no-store"
    assert "uPlot" in html and "new EventSource" in html and "/*ASSET:" not in html
    assert html.count("<script>") == 2 and 'id="chart-throughput"' in html


async def test_a_snapshot_shows_the_brokers_nodes_and_the_gateways_requests(app_client):
    client, _ = app_client
    assert (await client.post("/v1/completions", json={**BODY, "max_tokens": 8})).status == 200
    snap = await (await client.get("/dashboard/snapshot")).json()
    assert [(n["id"], n["state"]) for n in snap["nodes"]] == [("decode-0", "live"), ("prefill-0", "live")]
    assert snap["nodes"][0]["kv_used"] == 0.25 and snap["broker"]["ok"]
    assert snap["summary"]["ttft"]["count"] == 1 and snap["summary"]["requests"] == {"ok": 1}
    assert sum(n for n in snap["series"]["tokens_per_s"] if n is not None) in (0, 8)   # 0: still this second
    assert snap["summary"]["itl"]["count"] == 7
    assert snap["gateway"] == {"node_id": "gw-0", "in_flight": 0, "model": "m"}


async def test_the_event_stream_sends_a_snapshot_about_every_interval(app_client):
    client, _ = app_client
    response = await client.get("/dashboard/events")
    assert response.status == 200 and response.content_type == "text/event-stream"
    started = time.monotonic()
    first, second, third = await read_events(response, 3)
    assert time.monotonic() - started >= 0.15   # paced by the interval, not a flood
    assert first["type"] == "snapshot" and third["time"] > first["time"]
    response.close()


async def test_one_sampler_serves_every_viewer_and_stops_without_them(app_client):
    client, _ = app_client
    calls = []
    feed = client.app[dashboard.DASHBOARD]
    original = feed.gateway.backend.broker_stats

    async def counted() -> dict | None:
        calls.append(time.monotonic())
        return await original()

    feed.gateway.backend.broker_stats = counted
    viewers = [await client.get("/dashboard/events") for _ in range(4)]
    for viewer in viewers:
        await read_events(viewer, 2)
    assert len(calls) <= 6   # 4 viewers, 2 snapshots each: about 2 samples, not 8
    for viewer in viewers:
        viewer.close()
    await asyncio.sleep(0.5)
    assert feed.viewers == set() and feed._sampler is not None and feed._sampler.done()


async def test_the_broker_not_answering_is_shown_not_an_error():
    client, _ = await start(stats=None)
    try:
        snap = await (await client.get("/dashboard/snapshot")).json()
        assert snap["broker"]["ok"] is False and snap["nodes"] == []
    finally:
        await client.close()


async def test_with_api_keys_the_page_and_its_stream_need_the_key(capsys):
    client, _ = await start(api_keys=(KEY,))
    try:
        for path in ("/dashboard", "/dashboard/events", "/dashboard/snapshot"):
            refused = await client.get(path)
            assert refused.status == 401 and (await refused.json())["error"]["code"] == "invalid_api_key"
            assert (await client.get(path, params={"api_key": "sk-wrong"})).status == 401
        assert (await client.get("/dashboard", headers={"Authorization": f"Bearer {KEY}"})).status == 200
        assert (await client.get("/dashboard", params={"api_key": KEY})).status == 200
        assert (await client.get("/dashboard/snapshot", params={"api_key": KEY})).status == 200
        stream = await client.get("/dashboard/events", params={"api_key": KEY})
        assert stream.status == 200 and (await read_events(stream, 1))[0]["type"] == "snapshot"
        stream.close()
        for path in ("/metrics", "/slo/arrivals"):   # counts only: the planner and Prometheus hold no key
            assert (await client.get(path)).status == 200
    finally:
        await client.close()
    captured = capsys.readouterr()
    assert KEY not in captured.out + captured.err


async def test_without_api_keys_the_page_is_open(app_client):
    client, _ = app_client
    assert (await client.get("/dashboard")).status == 200
    assert (await client.get("/dashboard/snapshot")).status == 200


async def test_viewers_past_the_cap_get_a_503(app_client, monkeypatch):
    client, _ = app_client
    monkeypatch.setattr(dashboard, "MAX_VIEWERS", 1)
    first = await client.get("/dashboard/events")
    await read_events(first, 1)
    refused = await client.get("/dashboard/events")
    assert refused.status == 503 and refused.headers["Retry-After"] == "5"
    first.close()


async def test_a_bug_in_the_dashboard_never_fails_a_request(app_client):
    client, gateway = app_client

    def broken(*args, **kwargs):
        raise RuntimeError("dashboard bug")

    client.app[dashboard.DASHBOARD].window.observe_stream = broken
    response = await client.post("/v1/completions", json=BODY)
    assert response.status == 200 and (await response.json())["choices"][0]["text"]


async def test_shutdown_ends_open_streams_at_once():
    client, _ = await start()
    try:
        async with aiohttp.ClientSession() as viewer:   # a browser that keeps its stream open
            stream = await viewer.get(str(client.make_url("/dashboard/events")))
            await read_events(stream, 1)
            started = time.monotonic()
            await client.server.close()   # without the shutdown hook aiohttp waits 60 s for the stream
            assert time.monotonic() - started < 5
    finally:
        await client.close()


def test_the_page_and_its_assets_ship_as_package_data():
    import tomllib

    from tests.conftest import REPO_ROOT

    package_data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "static/*" in package_data["nodes.gateway"]
    names = {path.name for path in dashboard.STATIC.iterdir()}
    assert {"dashboard.html", "dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css",
            "uPlot.LICENSE"} <= names
