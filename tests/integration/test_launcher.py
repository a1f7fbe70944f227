"""`pdbus cluster` as a real process tree (idle nodes, so no model loads): it starts the broker
and every node, reports them ready, reports a node that dies, ends with exit code 1 when the
broker dies, and leaves no process behind on SIGTERM, SIGINT or its own SIGKILL."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from bus.bus_client import BusClient
from harness.cluster_procs import poll_until
from tests.bus.processes import LoggedProcess, pdbus

pytestmark = pytest.mark.integration


def _start_cluster(*flags: str) -> tuple[LoggedProcess, dict[str, int]]:
    # setsid: the launcher leads its own process group, like a shell's foreground job.
    launcher = LoggedProcess(["setsid", *pdbus("cluster", "--idle", "--endpoint", "tcp://127.0.0.1:0",
                                               "--stop-grace-s", "3", *flags)])
    ready = launcher.wait_for("cluster_ready", timeout=30)
    pids = {e["child"]: e["pid"] for e in launcher.find("cluster_child_started")}
    assert ready["num_nodes"] == len(pids) - 1
    return launcher, pids


def _gone(pids, timeout: float = 10.0) -> bool:
    return bool(poll_until(lambda: not any(_alive(pid) for pid in pids), timeout))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cleanup():
    launchers: list[LoggedProcess] = []
    pids: list[int] = []
    yield launchers, pids
    for launcher in launchers:
        launcher.stop()
    for pid in pids:   # never leave a child behind, whatever the test did
        if _alive(pid):
            psutil.Process(pid).kill()


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_cluster_starts_every_child_and_a_stop_signal_ends_them_all(cleanup, stop):
    launcher, pids = _start_cluster("--prefill", "1", "--decode", "2")
    cleanup[0].append(launcher)
    cleanup[1].extend(pids.values())
    assert set(pids) == {"broker", "prefill-0", "decode-0", "decode-1"}
    children = {p.pid for p in psutil.Process(launcher.process.pid).children()}
    assert children == set(pids.values())
    assert launcher.find("cluster_broker_ready")[0]["endpoint"].startswith("tcp://127.0.0.1:")
    if stop == "ctrl-c":   # the terminal signals the whole foreground process group
        os.killpg(launcher.process.pid, signal.SIGINT)
    else:
        launcher.signal(signal.SIGTERM)
    assert launcher.process.wait(15) == 0
    assert _gone(pids.values(), timeout=1)
    stopped = launcher.wait_for("cluster_stopped")
    assert set(stopped["returncodes"].values()) == {0}     # every child stopped itself cleanly
    assert {e["node_id"] for e in launcher.find("node_left", reason="disconnected")} == {
        "prefill-0", "decode-0", "decode-1"}               # nodes left before the broker did


def test_a_dead_node_is_reported_and_the_others_keep_serving(cleanup):
    launcher, pids = _start_cluster("--prefill", "0", "--decode", "2")
    cleanup[0].append(launcher)
    cleanup[1].extend(pids.values())
    endpoint = launcher.find("cluster_broker_ready")[0]["endpoint"]
    psutil.Process(pids["decode-0"]).kill()
    exited = launcher.wait_for("cluster_child_exited", child="decode-0")
    assert exited["returncode"] == -signal.SIGKILL
    launcher.wait_for("node_left", node_id="decode-0")
    with BusClient(endpoint) as client:
        final = client.call_blocking("decode", {"prompt": "x"}, key="chat", timeout=10)[-1]
    assert final.body == {"node_id": "decode-1"}
    assert launcher.process.poll() is None


def test_a_dead_broker_ends_the_cluster_with_an_error(cleanup):
    launcher, pids = _start_cluster("--prefill", "1", "--decode", "1")
    cleanup[0].append(launcher)
    cleanup[1].extend(pids.values())
    psutil.Process(pids["broker"]).kill()
    assert launcher.process.wait(15) == 1
    launcher.wait_for("cluster_broker_died")
    assert _gone(pids.values(), timeout=1)


def test_a_killed_launcher_leaves_no_orphans(cleanup):
    launcher, pids = _start_cluster("--prefill", "1", "--decode", "1")
    cleanup[1].extend(pids.values())
    launcher.signal(signal.SIGKILL)
    launcher.process.wait(5)
    assert _gone(pids.values())


def test_a_broker_that_cannot_bind_fails_the_cluster_fast(cleanup):
    launcher = LoggedProcess(pdbus("cluster", "--idle", "--endpoint", "tcp://256.0.0.1:1"))
    cleanup[0].append(launcher)
    assert launcher.process.wait(20) == 1
    assert launcher.wait_for("cluster_broker_failed")["returncode"] not in (None, 0)


def test_an_impossible_shape_is_a_configuration_error():
    launcher = LoggedProcess(pdbus("cluster", "--idle", "--decode", "0"))
    assert launcher.process.wait(20) == 2
    launcher._reader.join(5)
    assert "at least one decode node" in "".join(launcher.raw)


def test_colocated_runs_one_both_node_each_and_serves_both_services(cleanup):
    launcher, pids = _start_cluster("--colocated", "--nodes", "2")
    cleanup[0].append(launcher)
    cleanup[1].extend(pids.values())
    assert set(pids) == {"broker", "both-0", "both-1"}
    endpoint = launcher.find("cluster_broker_ready")[0]["endpoint"]
    with BusClient(endpoint) as client:
        for service in ("prefill", "decode"):
            assert client.call_blocking(service, {}, key="chat", timeout=10)[-1].body["node_id"] in pids
    launcher.signal(signal.SIGTERM)
    assert launcher.process.wait(15) == 0
