"""How pdbus sets vLLM up, and the clear errors when vLLM is missing or the wrong version (no vLLM needed)."""

from __future__ import annotations

import argparse

import pytest

from nodes.config_file import SettingsError
from nodes.engines import vllm_args
from nodes.engines.base import EngineConfig
from nodes.node_settings import add_node_arguments, node_settings


def test_missing_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(vllm_args, "installed_version", lambda: None)
    with pytest.raises(vllm_args.VllmUnavailable, match="make install-vllm"):
        vllm_args.require_vllm()


def test_another_vllm_version_is_refused(monkeypatch):
    monkeypatch.setattr(vllm_args, "installed_version", lambda: "0.29.1+cpu")
    with pytest.raises(vllm_args.VllmUnavailable, match=f"built against vLLM {vllm_args.VLLM_VERSION}"):
        vllm_args.require_vllm()
    monkeypatch.setattr(vllm_args, "installed_version", lambda: vllm_args.VLLM_VERSION + "+cpu")
    assert vllm_args.require_vllm().startswith(vllm_args.VLLM_VERSION)


def test_environment_defaults_yield_to_what_the_user_set(monkeypatch):
    environ = {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}      # a private copy: later tests' processes keep theirs
    monkeypatch.setattr(vllm_args.os, "environ", environ)
    vllm_args.prepare_environment(EngineConfig(num_threads=2))
    assert environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and environ["OMP_NUM_THREADS"] == "2"
    assert environ["HF_HUB_OFFLINE"] == "1"


def test_the_kv_budget_becomes_whole_vllm_blocks():
    config = EngineConfig(num_kv_blocks=512, block_size=16)
    assert vllm_args.cache_block_size(config) == 128
    assert vllm_args.num_cache_blocks(config, 128) == 64
    assert vllm_args.num_cache_blocks(EngineConfig(num_kv_blocks=1, block_size=16), 128) == 1
    assert vllm_args.max_context_tokens(config) == 63 * 128   # vLLM's own estimate here: 8064


def _args(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_node_arguments(parser)
    return parser.parse_args(list(argv))


def test_engine_kind_comes_from_the_flag_or_the_config(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[engine]\nkind = "vllm"\ndtype = "bfloat16"\n')
    assert node_settings(_args("--config", str(config)), "decode").engine_kind == "vllm"
    assert node_settings(_args("--config", str(config), "--engine", "torch"), "decode").engine_kind == "torch"
    settings = node_settings(_args("--config", str(config)), "decode")
    assert settings.engine_config().dtype == "bfloat16"     # `kind` is not an EngineConfig setting


def test_an_unknown_engine_kind_is_a_settings_error(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[engine]\nkind = "tensorrt"\n')
    with pytest.raises(SettingsError, match="kind must be one of torch, vllm"):
        node_settings(_args("--config", str(config)), "prefill")


def test_the_vllm_adapter_imports_without_numba():
    """vLLM 0.32 cannot start once numba's llvmlite is loaded, so its adapter must not pull it in."""
    import subprocess
    import sys

    code = ("import sys, nodes.engines.vllm_engine, nodes.node_settings, nodes.runtime; "
            "print('llvmlite' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False"


def test_vllm_keeps_prefix_blocks_where_pdbus_would_keep_kv():
    on, off = EngineConfig(), EngineConfig(prefix_cache_bytes=0, keep_prefixes=False)
    assert vllm_args.prefix_caching(on, "kv_producer") and vllm_args.prefix_caching(on, "kv_consumer")
    assert not vllm_args.prefix_caching(off, "kv_producer") and not vllm_args.prefix_caching(off, "kv_consumer")
    assert not vllm_args.prefix_caching(EngineConfig(prefix_cache_bytes=0), "kv_producer")
    assert vllm_args.prefix_caching(EngineConfig(prefix_cache_bytes=0), "kv_consumer")   # keep_prefixes
    assert not vllm_args.prefix_caching(EngineConfig(keep_prefixes=False), "kv_both")    # both sides needed
