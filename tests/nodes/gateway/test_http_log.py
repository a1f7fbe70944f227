"""A client sending malformed HTTP cannot flood the gateway's log: each request aiohttp's parser
refuses (answered 400) is one short `malformed_http` line without a traceback, at most a burst of
them and then a few per second, the rest counted; a real server error keeps its traceback."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
import structlog
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.test_utils import TestServer

from nodes.cluster import ClusterClient
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway import http_log
from nodes.gateway.app import Gateway, build_app, runner_options
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from tests.nodes.gateway.fake_bus import FakeBus

GARBAGE = [b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
           b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]


async def send_raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 5)
    writer.close()
    return answer


@pytest.fixture(autouse=True)
def fresh_throttle():
    for log_filter in http_log.server_logger().filters:
        log_filter.throttle = http_log.Throttle()


def served_as_the_gateway_serves(config: GatewayConfig) -> dict:
    options = runner_options(config)
    assert options.pop("handler_cancellation")   # TestServer sets it itself
    return options


def aiohttp_errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "Error handling request" in r.getMessage()]


def gateway(config: GatewayConfig) -> Gateway:
    cluster = ClusterClient("tcp://127.0.0.1:1")
    cluster.bus = FakeBus()
    return Gateway(config, Backend(cluster, ModelInfo(tiny_tokenizer(512), 2048), config))


async def test_malformed_requests_are_one_short_line_each_without_a_traceback(caplog):
    config = GatewayConfig(model_name="m")
    server = TestServer(build_app(gateway(config)))
    await server.start_server(**served_as_the_gateway_serves(config))
    try:
        with structlog.testing.capture_logs() as events:
            answers = [await send_raw(server.port, GARBAGE[i % len(GARBAGE)]) for i in range(40)]
    finally:
        await server.close()
    assert all(answer.split(b" ", 2)[1].startswith(b"4") for answer in answers), {a[:40] for a in answers}
    assert not aiohttp_errors(caplog) and "Traceback" not in caplog.text
    lines = [e for e in events if e["event"] == "malformed_http"]
    assert 1 <= len(lines) <= http_log.BURST and all("exc_info" not in e and len(e["error"]) <= 200 for e in lines)


async def test_a_real_server_error_still_logs_its_traceback(caplog):
    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a real bug")

    app = web.Application()
    app.router.add_get("/", broken)
    server = TestServer(app)
    await server.start_server(**served_as_the_gateway_serves(GatewayConfig(model_name="m")))
    try:
        with caplog.at_level(logging.ERROR):
            answer = await send_raw(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await server.close()
    assert answer.startswith(b"HTTP/1.1 500")
    (record,) = aiohttp_errors(caplog)
    assert record.exc_info and record.exc_info[0] is RuntimeError


def record_of(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except type(exc):
        info = sys.exc_info()
    return logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                             ("1.2.3.4",), info)


@pytest.mark.parametrize(("exc", "passes"), [(BadHttpMessage("bad header"), False),
                                             (LineTooLong("line", "8190"), False),
                                             (RuntimeError("bug"), True), (KeyError("k"), True)])
def test_only_the_parsers_refusals_are_shortened(exc, passes):
    with structlog.testing.capture_logs() as events:
        assert http_log.ClientFaults(http_log.Throttle()).filter(record_of(exc)) is passes
    assert len(events) == (0 if passes else 1)


def test_the_throttle_allows_a_burst_then_a_rate_and_counts_the_rest():
    throttle = http_log.Throttle(rate=1.0, burst=3)
    assert [throttle.allow(100.0) for _ in range(5)] == [True, True, True, False, False]
    assert throttle.num_suppressed == 2
    assert throttle.allow(101.0) and throttle.take_suppressed() == 2 and throttle.num_suppressed == 0
    assert not throttle.allow(101.1)
