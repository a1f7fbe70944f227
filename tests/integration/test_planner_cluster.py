"""The planner with real processes (tiny model): `pdbus cluster --planner` drains a prefill node over
its max (exit 0: no failure) and starts the decode node its min asks for, under a stable id, with
its metrics on the wire; `pdbus planner` (bus only) switches a switchable prefill node to decode
when the decode pool is below its min and there is no room for another node."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.request import urlopen

import pytest

from bus.bus_client import BusClient
from bus.constants import BROKER_STATS_SERVICE
from harness.cluster_procs import ClusterProcs, render_config
from tests.bus.processes import LoggedProcess, pdbus
from tests.integration.cluster_helpers import wait_until

pytestmark = pytest.mark.integration
FAST = {"interval_s": 0.3, "sustain_s": 0.6, "cooldown_s": 1.0, "settle_timeout_s": 60.0}
ENGINE = {"engine": {"model": "tiny", "dtype": "float32", "num_threads": 1},
          "decode": {"num_kv_blocks": 128, "max_num_seqs": 4}, "kv": {"quant": "raw", "compile": False},
          "heartbeat": {"interval_ms": 250, "liveness": 3}, "node": {"drain_timeout_s": 2.0}}


def broker_roles(endpoint: str) -> dict[str, str]:
    with BusClient(endpoint) as client:
        return client.call_blocking(BROKER_STATS_SERVICE, {}, timeout=5)[-1].body["role_by_node"]


def test_the_launchers_planner_drains_over_max_and_starts_under_min():
    planner = {**FAST, "min_prefill": 1, "max_prefill": 1, "min_decode": 2, "max_decode": 2, "max_nodes": 4,
               "metrics_port": 0}
    with tempfile.TemporaryDirectory(prefix="pdbus-planner-") as folder:
        config = Path(folder) / "cluster.toml"
        config.write_text(render_config({**ENGINE, "planner": planner}))
        launcher = LoggedProcess(pdbus("cluster", "--planner", "--config", str(config), "--no-gateway",
                                       "--endpoint", "tcp://127.0.0.1:0", "--prefill", "2", "--decode", "1",
                                       "--stop-grace-s", "5"))
        try:
            launcher.wait_for("cluster_ready", timeout=120)
            drained = launcher.wait_for("planner_decision", timeout=30, kind="scale_down")
            assert (drained["role"], drained["node_id"]) == ("prefill", "prefill-0")
            launcher.wait_for("cluster_node_drained", timeout=30, child="prefill-0")
            started = launcher.wait_for("planner_node_started", timeout=30, role="decode")
            assert started["node_id"] == "decode-1"
            launcher.wait_for("cluster_node_ready", timeout=120, node_id="decode-1")
            port = launcher.wait_for("planner_metrics")["port"]
            text = wait_for_text(port, 'pdbus_planner_nodes{pool="decode"} 2.0')   # decode-1 in its report
            assert 'pdbus_planner_decisions_total{kind="scale_up",role="decode"} 1.0' in text
            assert 'pdbus_planner_decisions_total{kind="scale_down",role="prefill"} 1.0' in text
            assert not launcher.find("cluster_child_exited")
        finally:
            launcher.stop(20)
        assert launcher.wait_exit(10) == 0


def wait_for_text(port: int, fragment: str) -> str:
    def scrape() -> str | None:
        text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return text if fragment in text else None
    return wait_until(scrape, timeout=30, message=fragment)


def test_the_bus_only_planner_switches_a_prefill_node_to_decode():
    planner = {**FAST, "min_prefill": 0, "max_prefill": 1, "min_decode": 2, "max_decode": 2, "max_nodes": 2}
    with ClusterProcs(num_prefill=1, num_decode=1, settings={**ENGINE, "planner": planner},
                      extra_args={"prefill": ["--switchable"]}) as cluster:
        process = LoggedProcess(pdbus("planner", "--config", str(cluster.config_path)))
        try:
            switched = process.wait_for("planner_decision", timeout=30, kind="switch_role")
            assert (switched["role"], switched["node_id"]) == ("decode", "prefill-0")
            cluster.nodes["prefill-0"].wait_for("role_switched", timeout=60)
            wait_until(lambda: broker_roles(cluster.broker_endpoint).get("prefill-0") == "decode", timeout=30,
                       message="prefill-0 registered as decode")
            assert not process.find("planner_action_failed")
        finally:
            process.stop()
        assert process.wait_exit(10) == 0
