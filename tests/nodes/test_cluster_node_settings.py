"""Node settings: config sections feed the engine and KV settings; CLI flags override them."""

from __future__ import annotations

import pytest

from nodes.config_file import SettingsError
from nodes.node_settings import node_settings
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


def test_the_kv_link_speed_and_chunk_size_come_from_the_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('quant = "int8"', 'quant = "int8"\nlink_gbit = 25\nchunk_mib = 1.5'))
    settings = node_settings(no_args(config=str(path)), "prefill")
    assert (settings.kv_link_gbit, settings.kv_chunk_mib) == (25.0, 1.5)
    path.write_text(CONFIG)
    defaults = node_settings(no_args(config=str(path)), "prefill")
    assert (defaults.kv_link_gbit, defaults.kv_chunk_mib) == (10.0, None)   # chunk_mib None: the default size
    assert node_settings(no_args(config=None), "prefill").kv_link_gbit == 35.0   # config/local.toml: loopback
    path.write_text(CONFIG.replace('quant = "int8"', 'quant = "int8"\nchunk_mib = "auto"'))
    assert node_settings(no_args(config=str(path)), "prefill").kv_chunk_mib is None


@pytest.mark.parametrize("line", ['link_gbit = 0', 'link_gbit = "fast"', 'link_gbit = "auto"', 'chunk_mib = -1',
                                  'chunk_mib = true', 'chunk_mib = 4096'])
def test_a_bad_kv_link_speed_or_chunk_size_is_a_clear_error(tmp_path, line):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('quant = "int8"', f'quant = "int8"\n{line}'))
    with pytest.raises(SettingsError, match=r"\[kv\] (link_gbit|chunk_mib) must be a number of (Gbit/s|MiB)"):
        node_settings(no_args(config=str(path)), "prefill")


def test_the_prefill_prefix_cache_budget_comes_from_its_section(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace("max_wait_ms = 20", "max_wait_ms = 20\nprefix_cache_mib = 64"))
    assert node_settings(no_args(config=str(path)), "prefill").engine_config().prefix_cache_bytes == 64 << 20
    assert node_settings(no_args(config=str(path)), "decode").engine_config().prefix_cache_bytes == 256 << 20
    for bad in ("-1", '"lots"', "true"):
        path.write_text(CONFIG.replace("max_wait_ms = 20", f"max_wait_ms = 20\nprefix_cache_mib = {bad}"))
        with pytest.raises(SettingsError, match="prefix_cache_mib"):
            node_settings(no_args(config=str(path)), "prefill")


def test_a_role_s_own_thread_count_wins_over_the_engine_s_and_a_flag_over_both(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace("[prefill]\n", "[prefill]\nnum_threads = 2\n"))
    assert node_settings(no_args(config=str(path)), "prefill").engine_config().num_threads == 2
    assert node_settings(no_args(config=str(path)), "decode").engine_config().num_threads == 1
    assert node_settings(no_args(config=str(path), threads=3), "prefill").engine_config().num_threads == 3


def test_lending_and_drain_settings_are_read_and_checked(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace("[decode]\n", "[decode]\nlend_prefill_tokens = 900\n") + "[node]\ndrain_timeout_s = 5\n")
    settings = node_settings(no_args(config=str(path)), "decode")
    assert (settings.lend.prefill_tokens, settings.lend.max_running, settings.drain_timeout_s) == (900, 1, 5.0)
    path.write_text(CONFIG.replace("[decode]\n", "[decode]\nlend_max_running = -1\n"))
    with pytest.raises(SettingsError, match="lend_max_running"):
        node_settings(no_args(config=str(path)), "decode")
    path.write_text(CONFIG + "[node]\nswitchable = true\n")
    with pytest.raises(SettingsError, match="prefill or decode"):
        node_settings(no_args(config=str(path)), "both")


def test_a_decode_step_prefills_one_chunk_unless_configured(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    assert node_settings(no_args(config=str(path)), "decode").engine_config().step_prefill_tokens == 256
    assert node_settings(no_args(config=str(path)), "both").engine_config().step_prefill_tokens == 0
    path.write_text(CONFIG.replace("[decode]\n", "[decode]\nprefill_chunk_tokens = 128\n"))
    assert node_settings(no_args(config=str(path)), "decode").engine_config().step_prefill_tokens == 128
    path.write_text(CONFIG.replace("[decode]\n", "[decode]\nstep_prefill_tokens = 0\n"))
    assert node_settings(no_args(config=str(path)), "decode").engine_config().step_prefill_tokens == 0
    for bad in ("-1", '"one"', "true", "2.5"):
        path.write_text(CONFIG.replace("[decode]\n", f"[decode]\nstep_prefill_tokens = {bad}\n"))
        with pytest.raises(SettingsError, match="step_prefill_tokens"):
            node_settings(no_args(config=str(path)), "decode")


@pytest.mark.parametrize(("line", "device", "on"), [
    ("", "cpu", False), ("", "cuda", True), ('device_codec = "auto"', "cuda:1", True),
    ('device_codec = "on"', "cpu", True), ('device_codec = "off"', "cuda", False)])
def test_the_device_codec_is_on_where_the_engine_runs_on_a_gpu_unless_configured(tmp_path, line, device, on):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('quant = "int8"', f'quant = "int8"\n{line}').replace(
        'dtype = "float32"', f'dtype = "float32"\ndevice = "{device}"'))
    prefill, decode = (node_settings(no_args(config=str(path)), role) for role in ("prefill", "decode"))
    assert prefill.kv_device_codec is decode.kv_device_codec is on
    # the prefill engine exports in the wire's mode; a decode engine exports nothing
    assert (prefill.engine_config().kv_export, decode.engine_config().kv_export) == ("int8" if on else "", "")


def test_a_bad_device_codec_is_a_clear_error_and_int8_sym_keeps_the_cpu_export(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.replace('quant = "int8"', 'quant = "int8"\ndevice_codec = "gpu"'))
    with pytest.raises(SettingsError, match=r'\[kv\] device_codec must be "auto", "on" or "off"'):
        node_settings(no_args(config=str(path)), "prefill")
    path.write_text(CONFIG.replace('quant = "int8"', 'quant = "int8_sym"\ndevice_codec = "on"'))
    assert node_settings(no_args(config=str(path)), "prefill").engine_config().kv_export == ""
