"""Hostile clients against a real gateway in front of a real tiny cluster (1 prefill + 1 decode):
input the bus cannot carry (a 300-byte session id, lone surrogates, integers beyond 64 bits) is a
400 at once over HTTP and an `error` message on the WebSocket, never a 503 after the plan
timeouts nor silence, and normal requests still stream afterwards; and sessions are scoped by API
key: key B sending key A's session id neither sees A's cached conversation nor evicts it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
KEY_A, KEY_B = "sk-hostile-tenant-a", "sk-hostile-tenant-b"
GOOD = {"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 3, "ignore_eos": True}
HOSTILE = [({"session_id": "s" * 300}, "session_id"), ({"prompt": "Hello \ud800 world"}, "prompt"),
           ({"seed": 2 ** 70}, "seed"), ({"top_k": 2 ** 70}, "top_k"), ({"stop": ["\udfff"]}, "stop"),
           ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages")]


@pytest.fixture(scope="module")
def gateway():
    with gateway_cluster(gateway={"api_keys": [KEY_A, KEY_B]}) as (_, gateway):
        yield gateway


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def path_of(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def body_of(change: dict) -> dict:
    return {**{k: v for k, v in GOOD.items() if "messages" not in change or k != "prompt"}, **change}


@pytest.mark.parametrize("change, param", HOSTILE)
def test_what_the_bus_cannot_carry_is_a_400_at_once_over_http(gateway, change, param):
    body = body_of(change)
    for stream in (False, True):
        started = time.monotonic()
        response = httpx.post(gateway.url + path_of(body), content=json.dumps({**body, "stream": stream}),
                              headers=bearer(KEY_A), timeout=5)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param and time.monotonic() - started < 1.0
    streamed = httpx.post(f"{gateway.url}/v1/completions", json={**GOOD, "stream": True}, headers=bearer(KEY_A),
                          timeout=30)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")


def test_what_the_bus_cannot_carry_is_an_error_message_on_the_websocket(gateway):
    url = gateway.url.replace("http://", "ws://") + f"/v1/stream?api_key={KEY_A}"
    with connect(url) as ws:
        for change, param in HOSTILE:
            started = time.monotonic()
            ws.send(json.dumps(body_of(change)))
            message = json.loads(ws.recv(timeout=5))
            assert message["type"] == "error" and message["error"]["status"] == 400, message
            assert message["error"]["param"] == param and time.monotonic() - started < 1.0
        ws.send(json.dumps(GOOD))
        kinds = [json.loads(ws.recv(timeout=30))["type"] for _ in range(4)]
    assert kinds == ["token", "token", "token", "done"]


def chat(gateway, key: str, messages: list[dict], session_id: str = "chat-1") -> dict:
    response = httpx.post(f"{gateway.url}/v1/chat/completions", headers=bearer(key), timeout=60, json={
        "model": TINY_NAME, "session_id": session_id, "messages": messages, "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.headers["X-Session-Id"] == session_id
    return response.json()


def test_key_b_cannot_see_or_evict_key_as_session(gateway):
    turn1 = [{"role": "user", "content": "Hello"}]
    reply = chat(gateway, KEY_A, turn1)["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    peek = chat(gateway, KEY_B, turn2)   # A's follow-up, sent by B under A's session id
    assert peek["pdbus"]["plans"] == ["remote"] and "num_cached_tokens" not in json.dumps(peek)
    chat(gateway, KEY_B, [{"role": "user", "content": "Something else entirely, to replace the session"}])
    follow_up = chat(gateway, KEY_A, turn2)
    assert follow_up["pdbus"]["plans"] == ["cached"] and follow_up["pdbus"]["session_id"] == "chat-1"
