"""kernels.cpu: one probe, cached for the process; each mask switches its feature off; what a node logs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nodes.engines.kernels import cpu


def probe_in_child(env: dict[str, str]) -> dict:
    """The probe of a fresh process (masks are read once, at the first probe)."""
    code = "import json; from nodes.engines.kernels.cpu import probe; print(json.dumps(probe().as_log()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture
def base_env(monkeypatch) -> dict[str, str]:
    import os
    env = {k: v for k, v in os.environ.items() if k not in cpu.MASKS}
    return env


def test_the_probe_is_taken_once_per_process():
    assert cpu.probe() is cpu.probe()


def test_no_mask_reports_the_host(base_env):
    features = probe_in_child(base_env)
    assert features["masked"] == []
    assert features["numba"] is True   # the suite installs numba
    assert set(features) == {"numba", "avx512f", "avx512bf16", "amx", "host_amx", "onednn_amx", "onednn_bf16",
                             "masked"}


@pytest.mark.parametrize(("mask", "off"), [
    ("PDBUS_NO_NUMBA", ("numba", "avx512bf16", "amx")),
    ("PDBUS_NO_AVX512BF16", ("avx512bf16",)),
    ("PDBUS_NO_AMX", ("amx", "onednn_amx")),
])
def test_each_mask_switches_its_features_off(base_env, mask, off):
    host = probe_in_child(base_env)
    features = probe_in_child({**base_env, mask: "1"})
    assert features["masked"] == [mask]
    for name in off:
        assert features[name] is False
    assert features["host_amx"] == host["host_amx"]   # rounding choices follow the CPU, not a mask
    assert probe_in_child({**base_env, mask: "0"})["masked"] == []


def test_a_oneDNN_cap_below_bf16_is_read(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert not cpu.onednn_may_use("BF16") and not cpu.onednn_may_use("AMX")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cpu.onednn_may_use("BF16") and not cpu.onednn_may_use("AMX")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "")
    assert cpu.onednn_may_use("AMX")
