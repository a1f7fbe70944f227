"""The device KV codec on a CUDA GPU (marked gpu; skipped where torch sees none): the same ops as on
the CPU (tests/nodes/engines/test_kv_device.py, test_kv_export.py) must give the numpy reference's
bytes there too, since each op rounds once in IEEE float32; the layer-by-layer export of a GPU
engine waits only for the layers a chunk needs, and chunks land on the device as the host path
decodes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines import kv_device
from nodes.engines.base import PrefillRequest, SamplingParams
from nodes.engines.kv_export import DeviceExport
from nodes.engines.kv_quant import TorchQuantizer
from tests.nodes.engines.engine_helpers import make_engine, reference_encode
from tests.nodes.engines.test_kv_export import CHUNK_BYTES, assert_export_is_the_reference, land_both

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_encode_on_the_gpu_is_the_reference_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(0)
    rows = (torch.randn(4096, 128, generator=generator) * torch.logspace(-4, 3, 4096)[:, None]).to(dtype)
    rows[:8] = torch.tensor([0.5, 1.5, 127.5, -0.0, 1 / 3, 2.0**-20, 255.0, 65000.0])[:, None].to(dtype)   # ties, tiny, huge
    ref_codes, ref_params, _ = reference_encode(rows)
    on_gpu = rows.cuda()
    codes = torch.empty(on_gpu.shape, dtype=torch.uint8, device="cuda")
    lo = torch.empty(rows.shape[0], dtype=torch.float16, device="cuda")
    hi = torch.empty_like(lo)
    assert bool(kv_device.encode_int8_rows(on_gpu, codes, lo, hi))
    np.testing.assert_array_equal(codes.cpu().numpy().reshape(-1), ref_codes)
    np.testing.assert_array_equal(torch.cat([lo, hi]).cpu().view(torch.uint8).numpy(), ref_params)
    out = torch.empty(rows.shape, dtype=torch.bfloat16, device="cuda")
    kv_device.decode_int8_rows(codes, lo, hi, out)
    expected = torch.empty(rows.shape, dtype=torch.bfloat16)
    kv_device.decode_int8_rows(codes.cpu(), lo.cpu(), hi.cpu(), expected)
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("mode", ["int8", "bf16", "raw"])
def test_a_gpu_engine_exports_the_reference_payloads_layer_by_layer(tiny_model, mode):
    engine = make_engine(tiny_model, device="cuda", dtype="bfloat16", kv_export=mode, prefix_cache_bytes=0)
    prompts = [PrefillRequest(f"r{n}", tuple(range(3, 3 + n)), SamplingParams(temperature=0.0)) for n in (40, 300)]
    for result in engine.prefill(prompts):
        assert isinstance(result.kv, DeviceExport) and result.kv.kv.is_cuda and result.kv.stream is not None
        assert_export_is_the_reference(result.kv, mode)
    chunked = engine.start_prefill(prompts, chunk_tokens=64)
    while not chunked.done:
        for result in chunked.step():
            assert_export_is_the_reference(result.kv, mode)


@pytest.mark.parametrize("mode", ["int8", "bf16", "raw"])
def test_chunks_land_on_the_gpu_as_the_host_decodes_them(mode):
    kv = (torch.randn(4, 2, 8, 300, 128) * 3).to(torch.bfloat16)
    host_out, device_out = land_both(kv, mode, TorchQuantizer(), torch.empty_like(kv, device="cuda"), CHUNK_BYTES * 100)
    assert torch.equal(device_out.cpu(), host_out)
