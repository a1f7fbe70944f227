"""`pdbus gateway` as a process when things are wrong: no broker (exit 1), a typo in [gateway]
(exit 2), a port already taken (exit 1), each with one clear line; with a broker and no nodes
it serves but is not ready (/ready 503, a completion 503)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from harness.cluster_procs import REPO_ROOT, ClusterProcs, free_port
from tests.integration.gateway_helpers import TINY_NAME, GatewayProc

pytestmark = pytest.mark.integration


def gateway(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodes.cli", "gateway", "--model", "tiny", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, env={**os.environ, **(env or {})})


def test_no_broker_is_exit_1():
    done = gateway("--broker", f"tcp://127.0.0.1:{free_port()}", "--broker-timeout", "1")
    assert done.returncode == 1 and "did not answer" in done.stderr


def test_a_typo_in_the_gateway_section_is_exit_2():
    done = gateway(env={"PDBUS__GATEWAY__RATE_LIMIT": "5"})
    assert done.returncode == 2 and "unknown [gateway] settings: rate_limit" in done.stderr


def test_a_taken_port_is_exit_1_and_a_cluster_without_nodes_is_not_ready():
    with ClusterProcs(num_prefill=0, num_decode=0) as cluster, socket.create_server(("127.0.0.1", 0)) as taken:
        done = gateway("--broker", cluster.broker_endpoint, "--port", str(taken.getsockname()[1]))
        assert done.returncode == 1 and "cannot listen" in done.stderr
        proc = GatewayProc(cluster)
        try:
            proc.proc.wait_for("gateway_started", timeout=60)
            ready = httpx.get(f"{proc.url}/ready")
            assert ready.status_code == 503 and ready.json()["services"] == {"prefill": False, "decode": False}
            refused = httpx.post(f"{proc.url}/v1/completions", timeout=60,
                                 json={"model": TINY_NAME, "prompt": "Hello", "max_tokens": 2})
            assert refused.status_code == 503 and "Retry-After" in refused.headers
        finally:
            proc.stop()
