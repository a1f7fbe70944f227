"""The engine under each CPU mask, in fresh processes: which kernels serve does not depend on the
runner's CPU for what the suite tests. Without numba, torch serves everything and numba is never
loaded; without AVX512-BF16 the bf16 linear layers and prefill attention run on torch (oneDNN,
SDPA) beside the other kernels; without AMX, no tile kernel runs. Each path's logits match torch's own path (the bf16
kernels round where torch rounds and differ only in float32 summation order)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from nodes.engines.kernels import cpu

pytestmark = pytest.mark.integration   # fresh processes; compiled kernels come from the disk cache


@functools.cache
def run(dtype: str, mask: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in cpu.MASKS}
    if mask:
        env[mask] = "1"
    out = subprocess.run([sys.executable, "-m", "tests.nodes.engines.kernels.paths_worker", dtype], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def assert_close_to_torch(result: dict, dtype: str) -> None:
    reference = run(dtype, "PDBUS_NO_NUMBA")
    for ours, theirs in zip(result["logits"], reference["logits"], strict=True):
        scale = float(np.abs(theirs).max())
        tolerance = 1e-4 if dtype == "float32" else 0.06
        np.testing.assert_allclose(ours, theirs, atol=tolerance * scale, rtol=0)
    assert result["tokens"][0] == reference["tokens"][0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_without_numba_torch_serves_everything_and_numba_is_never_loaded(dtype):
    result = run(dtype, "PDBUS_NO_NUMBA")
    assert set(result["plan"].values()) <= {"torch", 0}   # False == 0: attention_prefetch off
    assert result["loaded"] == []
    assert result["features"]["numba"] is False


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_with_the_hosts_features_the_kernels_serve_and_match_torch(dtype):
    result = run(dtype, None)
    if dtype == "bfloat16":
        assert result["plan"]["linear"] in ("amx", "dot_bf16")
        assert result["plan"]["decode_attention"] == "bf16" and result["plan"]["norm_rope"] == "bf16"
    else:
        assert result["plan"]["decode_attention"] == "f32"
    assert_close_to_torch(result, dtype)


def test_without_avx512_bf16_onednn_and_sdpa_serve_beside_the_other_kernels():
    result = run("bfloat16", "PDBUS_NO_AVX512BF16")
    assert result["features"]["avx512bf16"] is False
    assert result["plan"]["linear"] in ("amx", "torch")   # AMX needs no AVX512-BF16 mask to stay
    assert result["plan"]["decode_attention"] == "bf16" and result["plan"]["norm_rope"] == "bf16"
    if not result["features"]["amx"]:
        assert result["plan"]["linear"] == "torch" and result["plan"]["prefill_attention"] == "torch"
    assert_close_to_torch(result, "bfloat16")


def test_without_amx_no_tile_kernel_runs():
    result = run("bfloat16", "PDBUS_NO_AMX")
    assert result["features"]["amx"] is False and result["features"]["onednn_amx"] is False
    assert result["plan"]["linear"] != "amx" and result["plan"]["prefill_attention"] != "amx_tiles"
    assert_close_to_torch(result, "bfloat16")
