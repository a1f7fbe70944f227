"""`pdbus gateway --workers N` as a real process tree: the exit codes of one process (no broker: 1,
a taken port: 1, bad settings: 2), and against a real broker and tiny-model nodes, two workers on
one `--port 0` that both serve (each response names its worker in `X-Pdbus-Gateway`), hold a key
to its rate and concurrency limits together (not twice them), and keep the port serving while
the parent restarts a SIGKILLed worker; SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from harness.cluster_procs import REPO_ROOT, ClusterProcs, free_port, poll_until
from tests.integration.gateway_helpers import TINY_NAME, GatewayProc

pytestmark = pytest.mark.integration
GOOD = {"model": TINY_NAME, "prompt": "Hello world", "max_tokens": 2}
BURST = 4


def gateway(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodes.cli", "gateway", "--model", "tiny", "--workers", "2", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, env={**os.environ, **(env or {})})


def test_no_broker_is_exit_1_and_bad_worker_counts_are_exit_2():
    done = gateway("--broker", f"tcp://127.0.0.1:{free_port()}", "--broker-timeout", "1", "--port", "0")
    assert done.returncode == 1 and "did not answer" in done.stderr
    for env in ({"PDBUS__GATEWAY__WORKERS": "0"}, {"PDBUS__GATEWAY__WORKERS": "65"}):
        done = subprocess.run([sys.executable, "-m", "nodes.cli", "gateway", "--model", "tiny"], env={**os.environ, **env},
                              capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        assert done.returncode == 2 and "[gateway] workers must be a whole number in 1..64" in done.stderr


def test_a_taken_port_is_exit_1_before_any_worker_starts():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        done = gateway("--port", str(taken.getsockname()[1]))
    assert done.returncode == 1 and "cannot listen" in done.stderr and "gateway_worker" not in done.stderr
    with socket.create_server(("127.0.0.1", 0), reuse_port=True) as shared:   # another gateway's workers
        done = gateway("--port", str(shared.getsockname()[1]))
    assert done.returncode == 1 and "cannot listen" in done.stderr


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def served_by(response: httpx.Response) -> str:
    return response.headers["X-Pdbus-Gateway"]


def until_both_answer(send, limit: int = 60) -> list[httpx.Response]:
    """`send()` (a new connection each time, so the kernel picks a worker anew) until both
    workers have answered; SO_REUSEPORT spreads by the connection's hash, so a few suffice."""
    responses: list[httpx.Response] = []
    while len({served_by(r) for r in responses}) < 2:
        assert len(responses) < limit, f"one worker answered all {limit}"
        responses.append(send())
    return responses


def start(cluster: ClusterProcs, settings: dict) -> tuple[GatewayProc, str, dict[int, dict]]:
    """The gateway on `--port 0`; its URL (from `gateway_started`) and each worker's start event."""
    proc = GatewayProc(cluster, settings, "--workers", "2", "--port", "0", "--node-id", "gw")
    started = proc.proc.wait_for("gateway_started", timeout=90)
    url = started["url"]
    ready = poll_until(lambda: httpx.get(f"{url}/ready", timeout=5).status_code == 200, 30, interval=0.1)
    assert ready and started["workers"] == 2 and started["shared_limits"], proc.proc.log_tail()
    seats = {e["worker"]: e for e in proc.proc.find("gateway_worker_started")}
    assert sorted(seats) == [0, 1] and {e["node_id"] for e in seats.values()} == {"gw-w0", "gw-w1"}
    return proc, url, seats


def check_rate_limit_is_one_for_both(url: str) -> None:
    responses = until_both_answer(lambda: httpx.post(f"{url}/v1/completions", json=GOOD, headers=bearer("k1"),
                                                     timeout=30))
    responses += [httpx.post(f"{url}/v1/completions", json=GOOD, headers=bearer("k1"), timeout=30)
                  for _ in range(max(0, BURST + 1 - len(responses)))]
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == BURST and set(statuses) == {200, 429}, statuses   # per worker: up to 2 x BURST


def check_streams_in_flight_count_for_both(url: str) -> None:
    long = {**GOOD, "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=long, headers=bearer("k2"), timeout=30) as held:
        lines = held.iter_lines()   # kept: a discarded iterator closes the response
        next(lines)
        holder = served_by(held)
        refused = until_both_answer(lambda: httpx.post(f"{url}/v1/completions", json=GOOD, headers=bearer("k2")))
    other = [r for r in refused if served_by(r) != holder]
    assert other and all(r.status_code == 429 and "concurrent" in r.json()["error"]["message"] for r in other)


def check_a_killed_worker_is_restarted(proc: GatewayProc, url: str, seats: dict[int, dict]) -> None:
    os.kill(seats[1]["pid"], signal.SIGKILL)
    exited = proc.proc.wait_for("gateway_worker_exited", timeout=10, worker=1)
    assert exited["returncode"] == -signal.SIGKILL and exited["restart_in_s"] > 0
    # The port keeps serving meanwhile: a dead worker's socket leaves the kernel's group with it.
    assert all(httpx.get(f"{url}/health", timeout=5).status_code == 200 for _ in range(10))
    again = proc.proc.wait_for("gateway_worker_started", timeout=60, count=2, worker=1)
    assert again["pid"] != seats[1]["pid"] and again["node_id"] == "gw-w1"
    responses = until_both_answer(lambda: httpx.get(f"{url}/health", timeout=5))
    assert all(r.status_code == 200 for r in responses)
    assert httpx.post(f"{url}/v1/completions", json=GOOD, headers=bearer("k3"), timeout=30).status_code == 200


def test_two_workers_share_the_port_and_the_limits_and_outlive_a_killed_worker():
    settings = {"api_keys": ["k1", "k2", "k3"], "rate_limit_rps": 0.01, "rate_limit_burst": BURST,
                "max_streams_per_key": 1}
    slow_decode = {"decode": ["--test-step-delay-ms", "20"]}   # the held stream outlives the refusals
    with ClusterProcs(extra_args=slow_decode) as cluster:
        proc, url, seats = start(cluster, settings)
        try:
            check_rate_limit_is_one_for_both(url)
            check_streams_in_flight_count_for_both(url)
            check_a_killed_worker_is_restarted(proc, url, seats)
            proc.proc.signal(signal.SIGTERM)
            assert proc.proc.wait_exit(20) == 0
            assert len(proc.proc.find("gateway_started")) == 1 and proc.proc.find("gateway_stopped")
            workers = [e["pid"] for e in proc.proc.find("gateway_worker_started")]
            assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)
        finally:
            proc.stop()
