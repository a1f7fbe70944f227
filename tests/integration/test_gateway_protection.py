"""Protecting the service, through real sockets and processes: API keys (401), per-key rate and
concurrency limits (429 + Retry-After), the cluster's overload (503 + Retry-After), a client that
disconnects mid-stream (the cluster request is aborted and the decode node's KV returns to its
baseline), and a client that stops reading (cut off after the stall timeout, its request aborted,
while other streams carry on)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.cluster_helpers import wait_until
from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
GOOD = {"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 2}
LONG = {"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 1900, "ignore_eos": True, "stream": True}


def kv_blocks_free(node) -> int:
    return [e for e in node.events if e.get("event") in ("node_started", "capacity_updated")][-1]["capacity"]["kv_blocks_free"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_keys_rate_and_concurrency_limits():
    gateway_keys = {"api_keys": ["k1", "k2", "k3"], "rate_limit_rps": 0.2, "rate_limit_burst": 2,
                    "max_streams_per_key": 1}
    slow = {"decode": ["--test-step-delay-ms", "20"]}
    with gateway_cluster(gateway=gateway_keys, extra_args=slow) as (_, gateway):
        url = f"{gateway.url}/v1/completions"
        for headers in ({}, bearer("nope"), {"Authorization": "Basic k1"}):
            response = httpx.post(url, json=GOOD, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{gateway.url}/health").status_code == 200   # probes need no key
        assert [httpx.post(url, json=GOOD, headers=bearer("k1"), timeout=30).status_code for _ in range(2)] == [200, 200]
        limited = httpx.post(url, json=GOOD, headers=bearer("k1"))
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["type"] == "rate_limit_error"
        assert httpx.post(url, json=GOOD, headers=bearer("k2"), timeout=30).status_code == 200   # per key

        with httpx.stream("POST", url, json={**LONG, "max_tokens": 200}, headers=bearer("k3"), timeout=30) as held:
            lines = held.iter_lines()   # kept: a discarded iterator closes the response
            next(lines)
            second = httpx.post(url, json=GOOD, headers=bearer("k3"))
            assert second.status_code == 429 and "concurrent" in second.json()["error"]["message"]

        ws_url = gateway.url.replace("http://", "ws://") + "/v1/stream"
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url)
        assert refused.value.response.status_code == 401
        with connect(ws_url + "?api_key=k2") as ws:
            ws.send(json.dumps(GOOD))
            while (message := json.loads(ws.recv(timeout=30)))["type"] == "token":
                pass
            assert message["type"] == "done"
        metrics = httpx.get(f"{gateway.url}/metrics").text
        assert 'outcome="rate_limited"' in metrics and 'outcome="unauthorized"' in metrics


def test_a_full_cluster_is_503_with_retry_after_and_the_running_stream_is_untouched():
    settings = {"decode": {"max_num_seqs": 1}, "scheduler": {"queue_size": 0, "retry_after_s": 2.5}}
    slow = {"decode": ["--test-step-delay-ms", "40"]}
    with gateway_cluster(settings=settings, extra_args=slow) as (_, gateway):
        url = f"{gateway.url}/v1/completions"
        with httpx.stream("POST", url, json={**LONG, "max_tokens": 30}, timeout=60) as running:
            lines = running.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            for stream in (False, True):
                refused = httpx.post(url, json={**GOOD, "stream": stream}, timeout=30)
                assert refused.status_code == 503 and refused.headers["Retry-After"] == "3"
                assert refused.json()["error"]["code"] == "overloaded"
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in rest[-2]
        assert 'outcome="overloaded"' in httpx.get(f"{gateway.url}/metrics").text


@pytest.fixture(scope="module")
def stalling():
    slow = {"decode": ["--test-step-delay-ms", "5"]}
    with gateway_cluster(gateway={"stall_timeout_s": 1.0, "stream_buffer_tokens": 8,
                                                                "send_buffer_bytes": 16384}, extra_args=slow) as served:
        yield served


def test_a_client_disconnect_aborts_the_request_and_frees_the_kv(stalling):
    cluster, gateway = stalling
    decode = cluster.nodes["decode-0"]
    baseline = kv_blocks_free(decode)
    num_cancelled = len(decode.find("decode_cancelled"))
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=LONG, timeout=30) as response:
        request_id = response.headers["X-Request-Id"]
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    decode.wait_for("decode_cancelled", count=num_cancelled + 1, timeout=10)
    wait_until(lambda: kv_blocks_free(decode) == baseline, message="decode KV back to baseline")
    assert gateway.proc.wait_for("access", request_id=request_id)["outcome"] == "cancelled"


def test_a_stalled_consumer_is_cut_off_while_other_streams_carry_on(stalling):
    cluster, gateway = stalling
    decode = cluster.nodes["decode-0"]
    baseline = kv_blocks_free(decode)
    body = json.dumps(LONG).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a small window: the gateway's writes block
    sock.connect(("127.0.0.1", gateway.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        others: list[int] = []
        worker = threading.Thread(target=lambda: others.extend(
            httpx.post(f"{gateway.url}/v1/completions", json=GOOD, timeout=30).status_code for _ in range(3)))
        worker.start()
        stalled = gateway.proc.wait_for("access", outcome="stalled", timeout=30)
        worker.join(30)
        assert others == [200, 200, 200]
        assert stalled["num_tokens"] < LONG["max_tokens"]
        wait_until(lambda: kv_blocks_free(decode) == baseline, message="decode KV back to baseline")
        sock.settimeout(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sock.recv(65536):
            pass   # the gateway closed the connection: reading ends
    finally:
        sock.close()
