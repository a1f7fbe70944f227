"""`pdbus keys` and `[security]` end to end: real `pdbus broker` / `pdbus node --idle` processes
with CURVE from the config; and how `[security]` decides between CURVE and plain."""

from __future__ import annotations

import stat
import subprocess

import pytest

from bus.security import SecurityError
from nodes import bus_config
from nodes.bus_config import security_config
from tests.bus.processes import LoggedProcess, free_port, pdbus

pytestmark = pytest.mark.integration


def _keys(key_dir, *names: str) -> dict[str, str]:
    public = {}
    for name in names:
        done = subprocess.run(pdbus("keys", "generate", "--name", name, "--dir", str(key_dir)),
                              capture_output=True, text=True, check=True)
        public[name] = done.stdout.strip()
    return public


def _config(tmp_path, port: int) -> str:
    path = tmp_path / "secure.toml"
    path.write_text(f'[broker]\nendpoint = "tcp://127.0.0.1:{port}"\n'
                    f'[security]\nenabled = true\nkey_dir = "{tmp_path / "keys"}"\n'
                    '[security.admit]\ndecode = ["decode-1"]\ngateway = ["gateway"]\n')
    return str(path)


def test_keys_generate_prints_only_the_public_key_and_never_overwrites(tmp_path):
    public = _keys(tmp_path, "decode-1")["decode-1"]
    assert len(public) == 40
    secret_file = tmp_path / "decode-1.key_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = [line for line in secret_file.read_text().splitlines() if "secret-key" in line][0]
    again = subprocess.run(pdbus("keys", "generate", "--name", "decode-1", "--dir", str(tmp_path)),
                           capture_output=True, text=True)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert secret.split('"')[1] not in again.stdout + again.stderr


def test_keys_list_shows_what_the_config_admits(tmp_path):
    _keys(tmp_path / "keys", "decode-1")
    listed = subprocess.run(pdbus("keys", "list", "--config", _config(tmp_path, 1)),
                            capture_output=True, text=True, check=True).stdout
    assert "decode-1" in listed and "gateway" in listed and "MISSING" in listed   # no gateway key yet


def test_a_curve_broker_process_admits_configured_keys_only(tmp_path):
    port = free_port()
    _keys(tmp_path / "keys", "broker", "decode-1", "gateway", "intruder")
    config = _config(tmp_path, port)
    broker = LoggedProcess(pdbus("broker", "--config", config))
    admitted = LoggedProcess(pdbus("node", "--idle", "--role", "decode", "--node-id", "d1",
                                   "--key", "decode-1", "--config", config))
    intruder = LoggedProcess(pdbus("node", "--idle", "--role", "decode", "--node-id", "evil",
                                   "--key", "intruder", "--config", config))
    try:
        broker.wait_for("broker_started")
        assert broker.wait_for("node_joined", node_id="d1")["role"] == "decode"
        refused = broker.wait_for("peer_refused")
        assert refused["reason"] == "unknown CURVE key" and len(refused["key_fingerprint"]) == 12
        assert not broker.find("node_joined", node_id="evil")
        assert "secret" not in "".join(broker.raw + admitted.raw + intruder.raw).lower()
    finally:
        for process in (intruder, admitted, broker):
            process.stop()


def test_a_curve_broker_without_its_key_fails_at_start_with_the_file_named(tmp_path):
    (tmp_path / "keys").mkdir()
    done = subprocess.run(pdbus("broker", "--config", _config(tmp_path, free_port())),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "broker" in done.stderr and "[security]" in done.stderr


def test_auto_is_curve_off_loopback_plain_on_it_and_warns_when_forced_plain(tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr(bus_config.log, "warning", lambda event, **fields: warnings.append(event))
    assert security_config({}, "decode", "tcp://127.0.0.1:5555") is None
    with pytest.raises(SecurityError, match="decode"):   # CURVE wanted, no key: fail closed
        security_config({"security": {"key_dir": str(tmp_path)}}, "decode", "tcp://10.0.0.5:5555")
    assert security_config({"security": {"enabled": False}}, "decode", "tcp://10.0.0.5:5555") is None
    assert warnings == ["bus_plaintext"]
    with pytest.raises(SecurityError, match="enabled must be"):
        security_config({"security": {"enabled": "yes"}}, "decode", "tcp://10.0.0.5:5555")
