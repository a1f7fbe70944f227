"""`[broker] bind`: a broker binds another address than the one peers dial (a Service name in front
of it, docs/CLUSTER.md "On a Ray cluster"); a bind list that does not match the endpoints is a
configuration error."""

from __future__ import annotations

import pytest

from bus.endpoint import Endpoint
from harness.cluster_procs import Proc, free_port, pdbus
from nodes.commands.broker_cmd import bind_address
from nodes.config_file import SettingsError

pytestmark = pytest.mark.integration


def test_the_bind_entry_follows_the_broker_s_place_in_the_endpoint_list():
    broker = {"endpoint": "tcp://a:1,tcp://b:2", "bind": "tcp://0.0.0.0:1,tcp://0.0.0.0:2"}
    assert bind_address(broker, "tcp://b:2", 0) == "tcp://0.0.0.0:2"   # --endpoint names it
    assert bind_address(broker, "tcp://c:3", 1) == "tcp://0.0.0.0:2"   # else --index
    assert bind_address({"endpoint": "tcp://a:1"}, "tcp://a:1", 0) == "tcp://a:1"
    with pytest.raises(SettingsError, match="bind lists 1"):
        bind_address({"endpoint": "tcp://a:1,tcp://b:2", "bind": "tcp://0.0.0.0:1"}, "tcp://a:1", 0)


def test_peers_dial_a_name_while_the_broker_binds_an_address(tmp_path):
    port = free_port()
    config = tmp_path / "c.toml"
    config.write_text(f'[broker]\nendpoint = "tcp://localhost:{port}"\nbind = "tcp://127.0.0.1:{port}"\n')
    broker = Proc(pdbus("broker", "--config", str(config)))
    try:
        assert broker.wait_for("broker_started", timeout=30)["endpoint"] == f"tcp://127.0.0.1:{port}"
        with Endpoint(f"tcp://localhost:{port}", "control", "probe") as peer:
            assert peer.wait_registered(10)
    finally:
        broker.stop()
