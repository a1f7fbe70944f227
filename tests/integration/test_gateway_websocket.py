"""`/v1/stream` through the `websockets` client library and `pdbus client` as a real process:
tokens then `done` (usage, timings, pdbus), a cancel aborts mid-stream and the socket serves
the next request, bad messages get `error` messages without closing it, and the terminal client
streams a completion and a two-turn chat on one session."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from websockets.sync.client import connect

from harness.cluster_procs import REPO_ROOT
from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served():
    slow = {"decode": ["--test-step-delay-ms", "10"]}
    with gateway_cluster(extra_args=slow) as (cluster, gateway):
        yield cluster, gateway


def ws_url(gateway) -> str:
    return gateway.url.replace("http://", "ws://") + "/v1/stream"


def receive_until_done(ws) -> tuple[list[dict], dict]:
    tokens = []
    while True:
        message = json.loads(ws.recv(timeout=30))
        if message["type"] != "token":
            return tokens, message
        tokens.append(message)


def test_tokens_then_done_with_usage_timings_and_nodes(served):
    _, gateway = served
    with connect(ws_url(gateway)) as ws:
        ws.send(json.dumps({"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 6, "temperature": 0,
                            "ignore_eos": True}))
        tokens, done = receive_until_done(ws)
    assert [t["index"] for t in tokens] == list(range(6))
    assert done["type"] == "done" and done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 6 and done["timings"]["ttft_s"] > 0
    assert done["pdbus"]["decode_node"] == "decode-0" and done["pdbus"]["prefill_node"] == "prefill-0"


def test_cancel_aborts_and_the_socket_serves_the_next_request(served):
    cluster, gateway = served
    with connect(ws_url(gateway)) as ws:
        ws.send(json.dumps({"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 500, "ignore_eos": True}))
        for _ in range(3):
            assert json.loads(ws.recv(timeout=30))["type"] == "token"
        ws.send(json.dumps({"type": "cancel"}))
        tokens, done = receive_until_done(ws)
        assert done["type"] == "done" and done["finish_reason"] == "abort" and len(tokens) < 400
        cluster.nodes["decode-0"].wait_for("decode_cancelled", timeout=10)
        ws.send(json.dumps({"model": TINY_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        tokens, done = receive_until_done(ws)
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == len(tokens)


def test_bad_messages_get_errors_and_the_socket_stays_open(served):
    _, gateway = served
    with connect(ws_url(gateway)) as ws:
        for bad, status in (("{nope", 400), (json.dumps({"model": "other", "prompt": "x"}), 404),
                            (json.dumps({"model": TINY_NAME, "prompt": "x", "n": 3}), 400)):
            ws.send(bad)
            message = json.loads(ws.recv(timeout=10))
            assert message["type"] == "error" and message["error"]["status"] == status, message
        ws.send(b"\x00binary")
        assert json.loads(ws.recv(timeout=10))["type"] == "error"
        ws.send(json.dumps({"model": TINY_NAME, "prompt": "Hello", "max_tokens": 2}))
        assert receive_until_done(ws)[1]["type"] == "done"


def run_client(gateway, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodes.cli", "client", "--url", gateway.url, *args],
                          input=stdin, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)


def test_pdbus_client_streams_a_completion_with_a_summary(served):
    _, gateway = served
    done = run_client(gateway, "--prompt", "Hello world", "--max-tokens", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "TTFT" in done.stderr and "tok/s" in done.stderr and "decode decode-0" in done.stderr


def test_pdbus_client_chat_keeps_one_session_across_turns(served):
    _, gateway = served
    done = run_client(gateway, "--chat", "--max-tokens", "4", stdin="Hello there\nAnd then?\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("generated") == 2
    sessions = {e["session_id"] for e in gateway.proc.find("access", endpoint="websocket")[-2:]}
    assert len(sessions) == 1


def test_pdbus_client_reports_an_unreachable_gateway(served):
    done = subprocess.run([sys.executable, "-m", "nodes.cli", "client", "--url", "http://127.0.0.1:9", "--prompt",
                           "x"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 1 and "cannot stream" in done.stderr
