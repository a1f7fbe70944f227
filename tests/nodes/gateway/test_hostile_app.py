"""Hostile input against the app in process, with the real `ClusterClient` over a scripted bus
(tests/nodes/gateway/fake_bus.py): what the bus cannot carry is a 400 at once on HTTP and an
`error` message on the WebSocket, never a 503 after the plan timeouts and never silence; a
`ProtocolError` raised synchronously by `stream()` is a 400; deep nesting is a 400, not a 500;
unauthenticated probing does not grow the metrics; and requests that end any way (done, cancelled,
errored, client gone mid-stream) leave no state behind in the gateway or the cluster client."""

from __future__ import annotations

import asyncio
import gc
import json
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from nodes.cluster import ClusterClient
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.app import Gateway, build_app
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from tests.nodes.gateway.fake_bus import FakeBus

GOOD = {"model": "m", "prompt": "Hello", "max_tokens": 3}
HOSTILE = [({"session_id": "s" * 300}, "session_id"), ({"prompt": "a\ud800"}, "prompt"),
           ({"stop": ["\udfff"]}, "stop"), ({"seed": 2 ** 70}, "seed"), ({"top_k": 2 ** 70}, "top_k"),
           ({"model": "\ud800"}, "model"), ({"temperature": float("nan")}, "temperature")]


async def serving(api_keys: tuple[str, ...] = ()):
    config = GatewayConfig(model_name="m", api_keys=api_keys, stall_timeout_s=2.0)
    cluster = ClusterClient("tcp://127.0.0.1:1", plan_timeout_s=3.0, stall_timeout_s=3.0, max_retries=1, retry_delay_s=0.1)
    cluster.bus = FakeBus()
    gateway = Gateway(config, Backend(cluster, ModelInfo(tiny_tokenizer(512), 2048), config))
    client = TestClient(TestServer(build_app(gateway)))
    await client.start_server()
    return client, cluster.bus, gateway


@pytest.fixture
async def app():
    client, bus, gateway = await serving()
    yield client, bus, gateway
    await client.close()


def as_json(body: dict) -> str:
    return json.dumps(body)   # ensure_ascii: lone surrogates travel as \ud800 escapes, as a client sends them


async def ws_exchange(client, messages: list[str], timeout: float = 5.0) -> list[dict]:
    """Send each message and read until its `done` or `error`."""
    answers = []
    async with client.ws_connect("/v1/stream") as ws:
        for message in messages:
            await ws.send_str(message)
            while (answer := await ws.receive_json(timeout=timeout))["type"] == "token":
                pass
            answers.append(answer)
    return answers


@pytest.mark.parametrize("change, param", HOSTILE)
async def test_what_the_bus_cannot_carry_is_a_400_at_once_over_http(app, change, param):
    client, bus, _ = app
    started = time.monotonic()
    response = await client.post("/v1/completions", data=as_json({**GOOD, **change}),
                                 headers={"Content-Type": "application/json"})
    error = (await response.json())["error"]
    assert response.status == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert time.monotonic() - started < 1.0 and not bus.sent


async def test_what_the_bus_cannot_carry_is_an_error_message_on_the_websocket(app):
    client, bus, _ = app
    answers = await ws_exchange(client, [as_json({**GOOD, **change}) for change, _ in HOSTILE] + [as_json(GOOD)])
    for answer, (_, param) in zip(answers, HOSTILE, strict=False):
        assert answer["type"] == "error" and answer["error"]["status"] == 400 and answer["error"]["param"] == param
    assert answers[-1]["type"] == "done" and len(bus.sent) == 1   # and the socket still serves


async def test_deep_nesting_is_a_400_not_a_500(app):
    client, _, _ = app
    deep = '{"model": "m", "prompt": "hi", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = await client.post("/v1/completions", data=deep, headers={"Content-Type": "application/json"})
    assert response.status == 400 and "nest" in (await response.json())["error"]["message"]
    answers = await ws_exchange(client, [deep, as_json(GOOD)])
    assert answers[0]["type"] == "error" and answers[0]["error"]["status"] == 400 and answers[1]["type"] == "done"


async def test_a_protocol_error_from_stream_is_a_400_not_a_503(app):
    client, bus, _ = app
    bus.mode = "refuse_encoding"   # Endpoint.request raising ProtocolError in the caller's thread
    started = time.monotonic()
    for stream in (False, True):
        response = await client.post("/v1/completions", json={**GOOD, "stream": stream})
        assert response.status == 400, await response.text()
    answers = await ws_exchange(client, [as_json(GOOD)])
    assert answers[0]["type"] == "error" and answers[0]["error"]["status"] == 400
    assert time.monotonic() - started < 2.0


async def test_unauthenticated_probing_does_not_grow_the_metrics():
    client, _, gateway = await serving(api_keys=("k",))
    try:
        for number in range(200):
            assert (await client.post(f"/v1/probe-{number}", json=GOOD)).status == 401
        text = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    assert "probe-" not in text
    series = [s for metric in gateway.metrics.requests.collect() for s in metric.samples]
    assert len(series) <= 4


async def test_requests_that_end_any_way_leave_no_state_behind(app):
    client, bus, gateway = app
    bus.mode = "slow"
    await client.post("/v1/completions", json=GOOD)                               # done
    async with client.ws_connect("/v1/stream") as ws:                               # cancelled
        await ws.send_json({**GOOD, "max_tokens": 100})
        assert (await ws.receive_json(timeout=5))["type"] == "token"
        await ws.send_json({"type": "cancel"})
        while (await ws.receive_json(timeout=5))["type"] == "token":
            pass
    async with client.ws_connect("/v1/stream") as ws:                               # socket closed mid-stream
        await ws.send_json({**GOOD, "max_tokens": 100})
        assert (await ws.receive_json(timeout=5))["type"] == "token"
    async with aiohttp.ClientSession() as session, \
            session.post(client.make_url("/v1/completions"), json={**GOOD, "max_tokens": 100, "stream": True}
                         ) as response:                                             # HTTP client gone
        await response.content.readline()
    bus.mode = "error"
    await client.post("/v1/completions", json=GOOD)                                 # errored
    for _ in range(100):
        await asyncio.sleep(0.05)
        gc.collect()
        if not bus.open and not bus.tasks and not list(gateway.relays) and gateway.metrics.in_flight._value.get() == 0:
            break
    assert bus.open == {} and list(gateway.relays) == []
    assert gateway.metrics.in_flight._value.get() == 0
    assert all(bucket.num_streams == 0 for bucket in gateway.limiter.buckets.values())
