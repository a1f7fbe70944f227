"""Node settings: config sections feed the engine and KV settings; CLI flags override them."""

from __future__ import annotations

import pytest

from nodes.node_settings import node_settings
from nodes.settings import SettingsError
from tests.nodes.cluster_fakes import no_args

CONFIG = """
[broker]
endpoint = "tcp://127.0.0.1:7000"
[engine]
model = "tiny"
dtype = "float32"
num_threads = 1
[prefill]
max_batch_tokens = 512
max_wait_ms = 20
[decode]
num_kv_blocks = 64
max_num_seqs = 4
preallocate_kv = false
[kv]
quant = "int8"
data_bind = "tcp://127.0.0.1:0"
[scheduler]
local_suffix_tokens = 32
"""


def test_sections_feed_the_engine_config_by_role(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    decode = node_settings(no_args(config=str(path)), "decode")
    config = decode.engine_config()
    assert (decode.broker, decode.model, decode.kv_quant, decode.local_suffix_tokens) == (
        "tcp://127.0.0.1:7000", "tiny", "int8", 32)
    assert (config.num_kv_blocks, config.max_num_seqs, config.prefill_max_wait_s) == (64, 4, 0.02)
    assert config.preallocate_kv is False
    prefill = node_settings(no_args(config=str(path)), "prefill").engine_config()
    assert prefill.max_batch_tokens == 512 and prefill.num_kv_blocks != 64


def test_flags_override_the_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    settings = node_settings(no_args(config=str(path), broker="tcp://127.0.0.1:9", kv_quant="raw", model="other",
                                     threads=2, node_id="n1", test_step_delay_ms=30), "decode")
    assert (settings.broker, settings.kv_quant, settings.model, settings.node_id) == (
        "tcp://127.0.0.1:9", "raw", "other", "n1")
    assert settings.engine_config().num_threads == 2 and settings.step_delay_s == 0.03


def test_the_kv_endpoint_can_advertise_another_address_than_it_binds(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('data_bind = "tcp://127.0.0.1:0"',
                                   'data_bind = "tcp://127.0.0.1:7001"\ndata_advertise = "tcp://127.0.0.1:7002"'))
    settings = node_settings(no_args(config=str(path)), "decode")
    assert (settings.kv_bind, settings.kv_advertise) == ("tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002")
    flagged = node_settings(no_args(config=str(path), kv_advertise="tcp://127.0.0.1:9"), "decode")
    assert flagged.kv_advertise == "tcp://127.0.0.1:9"
    assert node_settings(no_args(config=None), "decode").kv_advertise == ""


def test_an_advertised_kv_endpoint_off_this_machine_asks_for_curve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # an empty default key_dir
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    with pytest.raises(SettingsError, match="key pair"):   # auto security: keys needed, none in key_dir
        node_settings(no_args(config=str(path), kv_advertise="tcp://203.0.113.5:7001"), "decode")
