"""`pdbus cluster` also runs the OpenAI gateway (a real process tree on the tiny model), alone or
as two workers (`--gateway-workers 2`): it is ready once the gateway (every worker) has registered,
serves a completion, and stops with the rest."""

from __future__ import annotations

import signal

import httpx
import pytest

from harness.cluster_procs import free_port
from tests.bus.processes import LoggedProcess, pdbus

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("workers", [1, 2])
def test_cluster_runs_the_gateway_which_serves_and_stops_with_it(workers):
    port = free_port()
    launcher = LoggedProcess(pdbus("cluster", "--model", "tiny", "--prefill", "1", "--decode", "1",
                                   "--endpoint", "tcp://127.0.0.1:0", "--stop-grace-s", "5",
                                   "--gateway-workers", str(workers)),
                             env={"PDBUS__GATEWAY__PORT": str(port), "PDBUS__ENGINE__NUM_THREADS": "1",
                                  "PDBUS__KV__COMPILE": "false"})
    try:
        ready = launcher.wait_for("cluster_ready", timeout=120)
        assert ready["num_nodes"] == 2 + workers   # prefill-0, decode-0 and the gateway's workers
        started = launcher.wait_for("gateway_started", timeout=30)
        assert started["port"] == port and started.get("workers", 1) == workers
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                              json={"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 3})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
        launcher.signal(signal.SIGTERM)
        assert launcher.process.wait(30) == 0
        assert launcher.wait_for("cluster_stopped")["returncodes"]["gateway"] == 0
    finally:
        launcher.stop()
