"""Nothing a client sends crashes the gateway or leaks a stack trace: raw malformed requests
(httpx and a bare socket) get 4xx answers in OpenAI's error shape, and the gateway keeps serving."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
GOOD = {"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 2}


@pytest.fixture(scope="module")
def gateway():
    with gateway_cluster(gateway={"max_tokens_limit": 512, "max_body_bytes": 65536}) as (_, gateway):
        yield gateway


def post(gateway, path="/v1/completions", **options) -> httpx.Response:
    return httpx.post(f"{gateway.url}{path}", timeout=30, **options)


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "Traceback" not in response.text
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2", b'{"model": "x",}'])
def test_malformed_json_is_400(gateway, content):
    assert_openai_error(post(gateway, content=content, headers={"Content-Type": "application/json"}), 400)


def test_invalid_utf8_is_400(gateway):
    error = assert_openai_error(post(gateway, content=b'{"model": "\xff\xfe", "prompt": "hi"}'), 400)
    assert "UTF-8" in error["message"]


def test_an_unknown_model_is_404_model_not_found(gateway):
    assert assert_openai_error(post(gateway, json={**GOOD, "model": "gpt-4o"}), 404, "model")["code"] == "model_not_found"


@pytest.mark.parametrize("change, param", [
    ({"max_tokens": "ten"}, "max_tokens"), ({"temperature": [1]}, "temperature"), ({"stream": "no"}, "stream"),
    ({"prompt": 42}, "prompt"), ({"prompt": ""}, "prompt"), ({"n": 17}, "n"), ({"max_tokens": 513}, "max_tokens"),
    ({"prompt": ["one", 2]}, "prompt"), ({"stop": {"a": 1}}, "stop"), ({"guided_regex": "(("}, "guided_regex"),
])
def test_wrong_or_unsupported_fields_are_400_naming_the_field(gateway, change, param):
    assert_openai_error(post(gateway, json={**GOOD, **change}), 400, param)


def test_a_prompt_longer_than_the_context_is_400_context_length_exceeded(gateway):
    error = assert_openai_error(post(gateway, json={**GOOD, "prompt": "Hello world " * 1200}), 400)
    assert error["code"] == "context_length_exceeded"
    error = assert_openai_error(post(gateway, json={**GOOD, "prompt": "Hello " * 1000, "max_tokens": 500}), 400)
    assert error["code"] == "context_length_exceeded"


def test_a_body_over_the_limit_is_413(gateway):
    assert_openai_error(post(gateway, json={**GOOD, "prompt": "x" * 70000}), 413)


def test_chat_without_messages_is_400(gateway):
    assert_openai_error(post(gateway, "/v1/chat/completions", json={"model": TINY_NAME, "prompt": "hi"}), 400,
                        "messages")


def test_unknown_fields_are_ignored_and_logged(gateway):
    response = post(gateway, json={**GOOD, "frobnicate": True, "priority": 0})
    assert response.status_code == 200, response.text
    request_id = response.json()["id"]
    assert gateway.proc.wait_for("ignored_fields", request_id=request_id)["fields"] == ["frobnicate", "priority"]


def test_unknown_paths_and_methods_answer_in_the_error_shape(gateway):
    assert_openai_error(httpx.get(f"{gateway.url}/v1/nothing"), 404)
    assert_openai_error(httpx.get(f"{gateway.url}/v1/completions"), 405)


def test_garbage_on_the_socket_leaves_the_gateway_serving(gateway):
    for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
                    b"\x00\x01\x02\xff" * 100, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
            sock.sendall(garbage)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert not answer or answer.split(b" ", 2)[1].startswith(b"4"), answer[:200]
        assert b"Traceback" not in answer
    assert post(gateway, json=GOOD).status_code == 200
    assert gateway.proc.alive
