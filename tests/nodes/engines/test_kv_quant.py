"""The torch KV quantizer agrees with the numpy reference and plugs into the sender/receiver."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bus.kv import KVReceiver, KVSender, KVValueError
from bus.kv.layout import f32_to_bf16_bits, plan_chunks
from bus.kv.quant import NumpyQuantizer, max_payload_sizes
from nodes.engines.kv_quant import TorchQuantizer
from tests.bus.kv.conftest import synthetic_kv

MODES = ["raw", "bf16", "int8", "int8_sym"]


@pytest.fixture(scope="module")
def compiled() -> TorchQuantizer:
    torch.set_num_threads(1)
    quantizer = TorchQuantizer(compile=True)
    quantizer.warmup()
    return quantizer


@pytest.fixture(params=["eager", "compiled"])
def quantizer(request, compiled) -> TorchQuantizer:
    return compiled if request.param == "compiled" else TorchQuantizer(compile=False)


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    return tensor.view(torch.int16).numpy().view(np.uint16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def encode_all(quantizer, kv, mode, chunk_bytes=3000):
    info = quantizer.kv_info(kv)
    specs = plan_chunks(info, chunk_bytes)
    sizes = max_payload_sizes(mode, max(s.num_rows for s in specs), info)
    chunks = []
    for spec in specs:
        payload = quantizer.encode(kv, info, spec, mode, [np.empty(n, np.uint8) for n in sizes])
        chunks.append((spec, [np.frombuffer(memoryview(f).cast("B"), np.uint8).copy() for f in payload.frames],
                       payload.scale_dtype))
    return info, chunks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_torch_payloads_equal_the_numpy_reference(quantizer, dtype, mode):
    kv = torch.from_numpy(synthetic_kv(tokens=50)).to(dtype)
    _, torch_chunks = encode_all(quantizer, kv, mode)
    reference = NumpyQuantizer()
    numpy_info = reference.kv_info(numpy_view(kv), "bfloat16" if dtype == torch.bfloat16 else None)
    numpy_chunks = []
    for spec, _, _ in torch_chunks:
        sizes = max_payload_sizes(mode, spec.num_rows, numpy_info)
        payload = reference.encode(numpy_view(kv), numpy_info, spec, mode, [np.empty(n, np.uint8) for n in sizes])
        numpy_chunks.append((spec, [np.frombuffer(memoryview(f).cast("B"), np.uint8) for f in payload.frames],
                             payload.scale_dtype))
    for (spec, ours, scale), (_, reference, reference_scale) in zip(torch_chunks, numpy_chunks, strict=True):
        assert scale == reference_scale
        for a, b in zip(ours, reference, strict=True):
            # bytes agree except where a value sits on a rounding tie (one code step at most)
            differing = np.flatnonzero(a != b)
            assert differing.size <= max(2, a.size // 1000), (spec, differing.size)


@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_torch_decodes_what_numpy_encoded_into_a_torch_destination(quantizer, mode, dst_dtype):
    source = synthetic_kv(tokens=50)
    info, chunks = encode_all(NumpyQuantizer(), source, mode)
    dst = torch.full(source.shape, float("nan"), dtype=dst_dtype)
    reference = np.zeros_like(source)
    for spec, frames, scale in chunks:
        quantizer.decode(frames, info, spec, mode, scale, dst)
        NumpyQuantizer().decode(frames, info, spec, mode, scale, reference)
    decoded = dst.float().numpy()
    tolerance = 0 if (mode == "raw" and dst_dtype == torch.float32) else np.abs(reference).max() * 2.0**-7
    assert np.abs(decoded - reference).max() <= tolerance + 1e-6


def test_raw_torch_round_trip_is_bit_exact(quantizer):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        kv = torch.from_numpy(synthetic_kv()).to(dtype)
        info, chunks = encode_all(quantizer, kv, "raw")
        dst = torch.zeros_like(kv)
        for spec, frames, scale in chunks:
            quantizer.decode(frames, info, spec, "raw", scale, dst)
        assert torch.equal(dst.view(torch.int16) if dtype != torch.float32 else dst,
                           kv.view(torch.int16) if dtype != torch.float32 else kv)


def test_out_of_float16_range_falls_back_to_float32_params(quantizer):
    kv = torch.from_numpy(synthetic_kv()) * 1e5
    info, chunks = encode_all(quantizer, kv, "int8", chunk_bytes=10**9)
    assert chunks[0][2] == "f32"
    dst = torch.zeros_like(kv)
    quantizer.decode(chunks[0][1], info, chunks[0][0], "int8", "f32", dst)
    assert (dst - kv).abs().max() <= (kv.amax() - kv.amin()) / 255


def test_non_finite_and_unsupported_tensors_are_refused(quantizer):
    kv = torch.from_numpy(synthetic_kv())
    kv[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(KVValueError, match="non-finite"):
        encode_all(quantizer, kv, "int8")
    with pytest.raises(KVValueError):
        quantizer.kv_info(torch.zeros(1, 2, 1, 4, 8, dtype=torch.int32))
    with pytest.raises(KVValueError):
        quantizer.kv_info(torch.zeros(1, 2, 1, 8, 4).transpose(3, 4))
    with pytest.raises(KVValueError):
        quantizer.dst_dtype(torch.zeros(1, dtype=torch.int64))


@pytest.mark.integration
async def test_torch_sender_numpy_receiver_and_back(compiled):
    receiver = KVReceiver(lambda tid, rid, info, mode: torch.zeros(info.shape, dtype=torch.bfloat16), quantizer=compiled)
    endpoint = await receiver.start()
    sender = KVSender(quantizer=compiled, chunk_bytes=8192)
    kv = torch.from_numpy(synthetic_kv(tokens=100))
    report = await sender.send(endpoint, "t1", "r1", kv, mode="int8")
    result = await receiver.result("t1", timeout=5)
    assert report.ok and result.ok and result.kv.dtype == torch.bfloat16
    assert (result.kv.float() - kv).abs().max() < 0.1
    await sender.close()
    await receiver.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fast_int8_is_bit_identical_to_numpy_both_ways(compiled, dtype):
    """The numba path (compile=True) encodes and decodes exactly as the numpy reference does."""
    assert compiled.fast_int8
    kv = torch.from_numpy(synthetic_kv(tokens=50, head_dim=64)).to(dtype)
    info, ours = encode_all(compiled, kv, "int8", chunk_bytes=20000)
    reference = NumpyQuantizer()
    source = numpy_view(kv)
    numpy_info = reference.kv_info(source, "bfloat16" if dtype == torch.bfloat16 else None)
    for dst_dtype in (torch.float32, torch.bfloat16):
        dst = torch.full(kv.shape, float("nan"), dtype=dst_dtype)
        expected = np.full(kv.shape, np.nan, np.float32)
        for spec, frames, scale in ours:
            sizes = max_payload_sizes("int8", spec.num_rows, numpy_info)
            payload = reference.encode(source, numpy_info, spec, "int8", [np.empty(n, np.uint8) for n in sizes])
            assert scale == payload.scale_dtype == "f16"
            for a, b in zip(frames, payload.frames, strict=True):
                np.testing.assert_array_equal(a, np.frombuffer(memoryview(b).cast("B"), np.uint8))
            compiled.decode(frames, info, spec, "int8", scale, dst)
            reference.decode(frames, numpy_info, spec, "int8", scale, expected)
        if dst_dtype == torch.float32:
            np.testing.assert_array_equal(dst.numpy(), expected)
        else:
            np.testing.assert_array_equal(numpy_view(dst), f32_to_bf16_bits(expected))


def test_a_failing_numba_kernel_falls_back_to_torch_for_good(monkeypatch):
    """No working numba (a compile error, say): the transfer still encodes and decodes, on torch."""
    from nodes.engines.kernels.kv_int8 import decode as int8_decode
    from nodes.engines.kernels.kv_int8 import encode as int8_kernels

    def broken(*args):
        raise RuntimeError("no LLVM here")

    quantizer = TorchQuantizer(compile=True)
    assert quantizer.fast_int8
    monkeypatch.setattr(int8_kernels, "encode_rows", broken)
    monkeypatch.setattr(int8_decode, "decode_rows", broken)
    kv = torch.from_numpy(synthetic_kv(tokens=20, head_dim=64))
    info, chunks = encode_all(quantizer, kv, "int8")
    assert not quantizer.fast_int8
    dst = torch.zeros_like(kv)
    for spec, frames, scale in chunks:
        quantizer.decode(frames, info, spec, "int8", scale, dst)
    assert (dst - kv).abs().max() <= (kv.amax() - kv.amin()) / 255
    quantizer.fast_int8 = True   # a decode-side failure alone falls back too
    quantizer.decode(chunks[0][1], info, chunks[0][0], "int8", chunks[0][2], dst)
    assert not quantizer.fast_int8
