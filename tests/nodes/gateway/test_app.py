"""The aiohttp app in process, on a real loopback socket, with a fake cluster client: what the
real cluster cannot easily be made to do — an internal bug (500, no stack trace), a cluster error
mid-stream (an SSE error chunk then [DONE]), retries exhausted (503 + Retry-After), a WebSocket
client that stops reading (closed, the generation aborted)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from nodes.cluster import ClusterError, GenerationResult, RequestTrace, StreamToken
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.app import Gateway, build_app
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.planner.slo_signals import SloSignals

BODY = {"model": "m", "prompt": "Hello", "max_tokens": 100}


class FakeGeneration:
    def __init__(self, prompt, sampling, behaviour: str) -> None:
        self.prompt, self.sampling, self.behaviour = tuple(prompt), sampling, behaviour
        self.trace = RequestTrace("r", "s", decode_node_ids=["decode-0"], prefill_node_ids=["prefill-0"],
                                  plans=["remote"])
        self.result = None
        self.closed = False

    def __aiter__(self):
        return self._run()

    async def _run(self):
        if self.behaviour == "bug":
            raise RuntimeError("a bug with a secret path /etc/shadow")
        if self.behaviour == "exhausted":
            raise ClusterError("retries_exhausted", "gave up", self.trace)
        text = "x" * 100_000 if self.behaviour == "huge" else "tok"
        for index in range(self.sampling.max_tokens):
            if self.behaviour == "fail_mid" and index == 2:
                raise ClusterError("retries_exhausted", "node lost twice", self.trace)
            yield StreamToken(index, index, text)
            await asyncio.sleep(0)
        self.result = GenerationResult("r", "s", [], "", "length", {"prompt_tokens": len(self.prompt),
                                                                     "completion_tokens": self.sampling.max_tokens},
                                       self.trace)

    async def aclose(self):
        self.closed = True


class FakeClient:
    def __init__(self) -> None:
        self.behaviour = "ok"
        self.generations: list[FakeGeneration] = []

    def generate(self, prompt, sampling, *, session_id=None, request_id=None, cache_salt="", **fork):
        self.generations.append(FakeGeneration(prompt, sampling, self.behaviour))
        return self.generations[-1]


@pytest.fixture
async def app_client():
    config = GatewayConfig(model_name="m", stall_timeout_s=0.5, stream_buffer_tokens=4, send_buffer_bytes=8192)
    fake = FakeClient()
    gateway = Gateway(config, Backend(fake, ModelInfo(tiny_tokenizer(512), 2048), config))
    client = TestClient(TestServer(build_app(gateway)))
    await client.start_server()
    yield client, fake
    await client.close()


async def test_an_internal_bug_is_a_500_without_a_stack_trace(app_client):
    client, fake = app_client
    fake.behaviour = "bug"
    response = await client.post("/v1/completions", json=BODY)
    text = await response.text()
    assert response.status == 500 and json.loads(text)["error"]["type"] == "internal_error"
    assert "Traceback" not in text and "shadow" not in text


async def test_retries_exhausted_is_a_503_with_retry_after(app_client):
    client, fake = app_client
    fake.behaviour = "exhausted"
    response = await client.post("/v1/completions", json={**BODY, "stream": True})
    assert response.status == 503 and response.headers["Retry-After"] == "1"
    assert (await response.json())["error"]["code"] == "retries_exhausted"


async def test_a_cluster_error_mid_stream_is_an_error_chunk_then_done(app_client):
    client, fake = app_client
    fake.behaviour = "fail_mid"
    response = await client.post("/v1/completions", json={**BODY, "stream": True})
    lines = [line for line in (await response.text()).split("\n\n") if line]
    assert response.status == 200 and len(lines) == 4
    assert json.loads(lines[2][6:])["error"]["code"] == "retries_exhausted" and lines[3] == "data: [DONE]"


async def test_a_websocket_client_that_stops_reading_is_closed_and_the_request_aborted(app_client):
    client, fake = app_client
    fake.behaviour = "huge"   # 100 kB per token: the socket buffers fill within a few tokens
    async with aiohttp.ClientSession(read_bufsize=4096) as session, \
            session.ws_connect(str(client.make_url("/v1/stream"))) as ws:
        await ws.send_str(json.dumps(BODY))
        await asyncio.sleep(2.0)   # read nothing
        assert fake.generations[0].closed
        kinds = []
        async for message in ws:   # drain: what was buffered, then the close
            kinds.append(message.type)
        assert ws.close_code == 1008


async def test_slo_arrivals_counts_what_the_cluster_served_by_second_of_arrival(app_client):
    client, fake = app_client
    for _ in range(3):
        assert (await client.post("/v1/completions", json={**BODY, "max_tokens": 3})).status == 200
    fake.behaviour = "exhausted"
    assert (await client.post("/v1/completions", json=BODY)).status == 503            # the cluster failed it
    assert (await client.post("/v1/completions", json={"prompt": 5})).status == 400   # the client's fault

    def totals(body: dict) -> list[int]:
        return [sum(row[i] for row in body["seconds"]) for i in (1, 2, 3)]
    generous = await (await client.get("/slo/arrivals?ttft_s=60&tpot_s=60")).json()
    assert totals(generous) == [3, 1, 0] and generous["window_s"] > 0 and generous["now"] > 0
    strict = await (await client.get("/slo/arrivals?ttft_s=0.000001")).json()
    assert totals(strict) == [0, 4, 0]


@pytest.mark.parametrize("query", ["ttft_s=abc", "ttft_s=nan", "tpot_s=-1", "ttft_s=1e9", "tpot_s=inf"])
async def test_slo_arrivals_refuses_a_target_out_of_bounds(app_client, query):
    client, _ = app_client
    response = await client.get(f"/slo/arrivals?{query}")
    assert response.status == 400 and (await response.json())["error"]["param"] in ("ttft_s", "tpot_s")


async def test_the_planners_signals_read_the_arrivals_over_http(app_client):
    client, _ = app_client
    for _ in range(2):
        assert (await client.post("/v1/completions", json={**BODY, "max_tokens": 3})).status == 200
    signals = SloSignals(str(client.make_url("/metrics")), targets=(30.0, 30.0))
    got = await asyncio.to_thread(signals)   # urllib blocks: the server must keep serving meanwhile
    assert got.arrivals is not None and sum(c.within for c in got.arrivals) == 2
    assert sum(c.missed for c in got.arrivals) == 0
