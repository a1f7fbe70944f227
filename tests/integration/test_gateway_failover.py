"""Transparency under failure: the decode node serving an SSE stream is SIGKILLed mid-stream (2
decode nodes, raw KV, greedy); the client's stream goes on without a gap, its text equals the
fault-free text, and the final chunk's `pdbus` object says a failover happened and names both
decode nodes. /ready follows the nodes: still ready with one decode node left, 503 once the only
prefill node is gone."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
REQUEST = {"model": TINY_NAME, "prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "ignore_eos": True}


def test_a_decode_node_killed_mid_stream_is_reported_as_a_failover():
    slow = {"decode": ["--test-step-delay-ms", "20"]}
    with gateway_cluster(num_decode=2, extra_args=slow) as (cluster, gateway):
        url = f"{gateway.url}/v1/completions"
        expected = httpx.post(url, json=REQUEST, timeout=60).json()["choices"][0]["text"]
        chunks = []
        with httpx.stream("POST", url, json={**REQUEST, "stream": True}, timeout=60) as response:
            serving = response.headers["X-Pdbus-Decode-Node"]
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 5:
                    cluster.kill(serving)
        text = "".join(c["choices"][0]["text"] for c in chunks)
        info = chunks[-1]["pdbus"]
        assert text == expected
        assert info["failover"] and info["num_failovers"] == 1
        assert info["decode_nodes"][0] == serving and info["decode_node"] != serving
        assert info["failures"] == [f"node_lost@{serving}"]

        assert httpx.get(f"{gateway.url}/ready").json()["ready"]
        cluster.kill("prefill-0")
        deadline = time.monotonic() + 10
        while (ready := httpx.get(f"{gateway.url}/ready")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.status_code == 503 and ready.json()["services"] == {"prefill": False, "decode": True}
