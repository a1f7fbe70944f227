"""`pdbus broker` and `pdbus node` read [broker]/[heartbeat] from the config, environment
overrides and flags, in that order of precedence."""

from __future__ import annotations

import pytest

from tests.bus.processes import LoggedProcess, free_port, pdbus, start_broker

pytestmark = pytest.mark.integration


def test_broker_flags_override_environment_and_config(tmp_path):
    port = free_port()
    config = tmp_path / "cluster.toml"
    config.write_text(f'[broker]\nendpoint = "tcp://127.0.0.1:{port}"\n[heartbeat]\ninterval_ms = 400\nliveness = 5\n')
    broker = LoggedProcess(pdbus("broker", "--config", str(config), "--liveness", "2"),
                           env={"PDBUS__HEARTBEAT__INTERVAL_MS": "100"})
    try:
        started = broker.wait_for("broker_started")
        assert (started["endpoint"], started["heartbeat_ms"], started["liveness"]) == (
            f"tcp://127.0.0.1:{port}", 100.0, 2)
    finally:
        broker.stop()


def test_node_command_registers_with_role_capacity_and_leaves_cleanly():
    port = free_port()
    broker = start_broker(port)
    node = LoggedProcess(pdbus("node", "--idle", "--role", "both", "--node-id", "colo",
                               "--broker", f"tcp://127.0.0.1:{port}"))
    try:
        joined = broker.wait_for("node_joined", node_id="colo")
        assert joined["role"] == "both"
        assert {"kv_blocks_free", "max_batch_tokens"} <= set(joined["capacity"])
        node.stop()   # SIGTERM: the node says DISCONNECT on its way out
        assert broker.wait_for("node_left", node_id="colo")["reason"] == "disconnected"
    finally:
        node.stop()
        broker.stop()
