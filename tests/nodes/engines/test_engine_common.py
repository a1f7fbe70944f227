"""`resolve_dtype`: names, "auto" by what the CPU multiplies bf16 with, and the PDBUS_NO_AMX switch.
`resolve_device`: cpu, cuda, cuda:N, and a clear error for a device this torch cannot use."""

import pytest
import torch

from nodes.engines.engine_common import resolve_device, resolve_dtype, resolve_dtype_name
from nodes.engines.kernels import cpu as kernels_cpu


@pytest.fixture
def cpu(monkeypatch):
    """Pretend the CPU has the given features (as torch's probes report them)."""
    monkeypatch.delenv("PDBUS_NO_AMX", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    def set_features(*features: str) -> None:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: "amx" in features, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: "avx512_bf16" in features, raising=False)
    return set_features


def test_named_dtypes_resolve_to_themselves():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype_name("float16") == "float16"


def test_an_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dtype 'int3'.*auto"):
        resolve_dtype("int3")


@pytest.mark.parametrize(("features", "expected"), [
    (("amx", "avx512_bf16"), "bfloat16"),
    (("avx512_bf16",), "bfloat16"),     # decode 1.7-2.4x fp32's, prefill 0.84x (bench-engine)
    ((), "float32"),                    # oneDNN emulates bf16: prefill 0.31x fp32's
])
def test_auto_picks_bf16_where_onednn_multiplies_it_in_hardware(cpu, features, expected):
    cpu(*features)
    assert resolve_dtype_name("auto") == expected
    assert resolve_dtype_name("auto", "cuda:0") == "bfloat16"


def test_auto_follows_a_onednn_isa_cap(cpu, monkeypatch):
    cpu("amx", "avx512_bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not kernels_cpu.onednn_amx()
    assert resolve_dtype_name("auto") == "bfloat16"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core")
    assert resolve_dtype_name("auto") == "float32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert kernels_cpu.onednn_amx()


def test_pdbus_no_amx_switches_amx_off(cpu, monkeypatch):
    cpu("amx", "avx512_bf16")
    assert kernels_cpu.onednn_amx()
    monkeypatch.setenv("PDBUS_NO_AMX", "1")
    assert not kernels_cpu.onednn_amx()
    assert resolve_dtype_name("auto") == "bfloat16"    # AVX512-BF16 is still there
    monkeypatch.setenv("PDBUS_NO_AMX", "0")
    assert kernels_cpu.onednn_amx()


def test_cpu_is_always_a_device():
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "mps", ""])
def test_an_unknown_device_is_a_clear_error(name):
    with pytest.raises(ValueError, match=r'unknown \[engine\] device .*"cpu", "cuda" or "cuda:N"'):
        resolve_device(name)


def test_a_gpu_torch_cannot_see_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device = 'cuda', but torch .* sees no CUDA GPU .*use device = \"cpu\""):
        resolve_device("cuda")


def test_a_gpu_index_past_the_last_one_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1") and resolve_device("cuda").type == "cuda"
    with pytest.raises(ValueError, match=r"'cuda:2', but torch sees 2 CUDA GPU\(s\) \(cuda:0..cuda:1\)"):
        resolve_device("cuda:2")
