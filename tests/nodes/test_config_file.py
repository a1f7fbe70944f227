"""Cluster settings: TOML file, environment overrides, clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.config_file import SettingsError, load_settings, section, whole_number


def test_shipped_local_config_loads(repo_root):
    settings = load_settings(repo_root / "config" / "local.toml", environ={})
    assert section(settings, "broker")["endpoint"] == "tcp://127.0.0.1:5555"
    assert section(settings, "heartbeat")["interval_ms"] == 250


def test_env_overrides_file_with_typed_values(repo_root):
    env = {"PDBUS__HEARTBEAT__INTERVAL_MS": "100", "PDBUS__BROKER__ENDPOINT": "tcp://127.0.0.1:7000",
           "PDBUS__NEW__FLAG": "true", "PDBUS__NEW__WORD": "plain", "OTHER": "ignored"}
    settings = load_settings(repo_root / "config" / "local.toml", environ=env)
    assert settings["heartbeat"]["interval_ms"] == 100
    assert settings["broker"]["endpoint"] == "tcp://127.0.0.1:7000"
    assert settings["new"] == {"flag": True, "word": "plain"}


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_malformed_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker\nendpoint = 1")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(bad, environ={})


def test_section_must_be_a_table():
    with pytest.raises(SettingsError, match="must be a table"):
        section({"broker": 3}, "broker")


def test_settings_never_import_the_cli():
    """Settings are read by the CLI, not the other way round (nodes/bus_config.py holds what
    node settings used to take from nodes.commands)."""
    import subprocess
    import sys

    code = "import sys, nodes.node_settings; print(sorted(m for m in sys.modules if m.startswith('nodes.commands')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@given(value=st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=5), st.none()))
def test_a_whole_number_setting_is_taken_only_as_one(value):
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        assert whole_number(value, "[decode] lend_max_running") == value
    else:
        with pytest.raises(SettingsError, match=r"^\[decode\] lend_max_running must be a whole number >= 0, got "):
            whole_number(value, "[decode] lend_max_running")
