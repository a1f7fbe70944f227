"""Prompts' KV encoded on the device as layers finish (nodes/engines/kv_export.py), and received
chunks decoded on the device (kv_landing.py), on the CPU: every chunk's payload is byte for byte what
bus/kv's numpy reference makes of the engine's KV, for a whole pass, a chunked one and a prompt with a
cached prefix; a tail; the reference's fallbacks; the errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bus.kv.kv_errors import KVValueError
from bus.kv.layout import KVInfo, plan_chunks
from bus.kv.quant import NumpyQuantizer, max_payload_sizes
from nodes.engines import kv_device
from nodes.engines.base import EngineConfig, PrefillRequest, SamplingParams
from nodes.engines.kv_device import host_numpy
from nodes.engines.kv_export import DeviceExport, kv_tail
from nodes.engines.kv_quant import TorchQuantizer
from tests.nodes.engines.engine_helpers import make_engine

GREEDY = SamplingParams(temperature=0.0)
CHUNK_BYTES = 3000   # many chunks, some splitting a plane's tokens


def requests(vocab_size: int, lengths=(37, 100, 5)) -> list[PrefillRequest]:
    generator = torch.Generator().manual_seed(1)
    return [PrefillRequest(f"r{i}", tuple(torch.randint(0, vocab_size, (n,), generator=generator).tolist()), GREEDY)
            for i, n in enumerate(lengths)]


def numpy_of(kv: torch.Tensor) -> np.ndarray:
    return host_numpy(kv.cpu())


def payloads(quantizer, kv, info: KVInfo, mode: str) -> list[list[bytes]]:
    max_rows = max(spec.num_rows for spec in plan_chunks(info, CHUNK_BYTES))
    out = []
    for spec in plan_chunks(info, CHUNK_BYTES):
        outs = [np.empty(size, np.uint8) for size in max_payload_sizes(mode, max_rows, info)]
        payload = quantizer.encode(kv, info, spec, mode, outs)
        out.append([bytes(memoryview(np.ascontiguousarray(frame)).cast("B")) for frame in payload.frames]
                   + [payload.scale_dtype.encode()])
    return out


def assert_export_is_the_reference(export: DeviceExport, mode: str) -> None:
    reference = payloads(NumpyQuantizer(), numpy_of(export.kv), export.info, mode)
    assert payloads(TorchQuantizer(), export, export.info, mode) == reference


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["int8", "bf16", "raw"])
def test_a_whole_pass_exports_the_reference_payloads(tiny_model, mode, dtype):
    engine = make_engine(tiny_model, dtype=dtype, kv_export=mode, prefix_cache_bytes=0)
    plain = make_engine(tiny_model, dtype=dtype, prefix_cache_bytes=0)
    batch = requests(tiny_model.config.vocab_size)
    for result, expected in zip(engine.prefill(batch), plain.prefill(batch), strict=True):
        assert isinstance(result.kv, DeviceExport) and result.kv.mode == mode
        assert result.first_token_id == expected.first_token_id
        assert torch.equal(result.kv.kv, expected.kv)   # encoding on the way changes nothing computed
        assert_export_is_the_reference(result.kv, mode)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64])
def test_a_chunked_pass_exports_every_span(tiny_model, chunk_tokens):
    engine = make_engine(tiny_model, kv_export="int8", prefix_cache_bytes=0)
    prefill = engine.start_prefill(requests(tiny_model.config.vocab_size), chunk_tokens=chunk_tokens)
    results = []
    while not prefill.done:
        results.extend(prefill.step())
    assert len(results) == 3
    for result in results:
        assert_export_is_the_reference(result.kv, "int8")


def test_a_cached_prefix_is_exported_with_the_rest(tiny_model):
    engine = make_engine(tiny_model, kv_export="int8", block_size=16)
    prompt = requests(tiny_model.config.vocab_size, (100,))[0]
    engine.prefill([prompt])
    again = engine.prefill([PrefillRequest("again", prompt.prompt_token_ids[:90] + (3, 4, 5), GREEDY)])[0]
    assert again.num_cached_tokens == 80
    assert_export_is_the_reference(again.kv, "int8")


def test_a_tail_is_the_reference_of_the_tokens_after_the_offset(tiny_model):
    engine = make_engine(tiny_model, kv_export="int8", prefix_cache_bytes=0)
    export = engine.prefill(requests(tiny_model.config.vocab_size, (100,)))[0].kv
    tail = kv_tail(export, 30)
    assert tail.info.shape[3] == 70 and torch.equal(tail.kv, export.kv[:, :, :, 30:])
    assert_export_is_the_reference(tail, "int8")
    plain = torch.randn(2, 2, 1, 10, 4)
    assert torch.equal(kv_tail(plain, 4), plain[:, :, :, 4:])


def exported(kv: torch.Tensor, mode: str = "int8") -> DeviceExport:
    export = DeviceExport(kv, mode)
    for layer in range(kv.shape[0]):
        export.layer_done(layer, 0, kv.shape[3])
    return export


def test_a_range_beyond_float16_is_sent_with_the_references_float32_params():
    kv = torch.randn(2, 2, 2, 40, 16)
    kv[1, 0, 1, 7, 3] = 1e6
    export = exported(kv)
    assert export.fits.tolist() == [True, False]
    assert_export_is_the_reference(export, "int8")
    assert any(frames[-1] == b"f32" for frames in payloads(TorchQuantizer(), export, export.info, "int8"))


def test_the_reference_reads_one_host_copy_of_the_kv_for_every_chunk(monkeypatch):
    """On a GPU each chunk of a layer that does not fit would copy the whole KV out again."""
    kv = torch.randn(2, 2, 2, 40, 16)
    kv[1, :, :, 3, 0] = 1e6   # every plane of layer 1: each of its chunks takes the reference
    export, copies = exported(kv), []
    host_numpy = kv_device.host_numpy
    monkeypatch.setattr(kv_device, "host_numpy",   # the KV whole on the host: what the reference reads
                        lambda tensor: copies.append(tensor.shape == kv.shape) or host_numpy(tensor))
    chunks = payloads(TorchQuantizer(), export, export.info, "int8")
    assert sum(frames[-1] == b"f32" for frames in chunks) > 1 and sum(copies) == 1
    monkeypatch.undo()
    assert_export_is_the_reference(export, "int8")


def test_non_finite_kv_is_the_references_clear_error():
    kv = torch.randn(2, 2, 2, 40, 16)
    kv[0, 1, 0, 2, 0] = float("nan")
    with pytest.raises(KVValueError, match="non-finite"):
        payloads(TorchQuantizer(), exported(kv), KVInfo(tuple(kv.shape), "float32"), "int8")


def test_a_mode_the_export_was_not_made_for_is_refused():
    export = exported(torch.randn(1, 2, 1, 8, 4))
    with pytest.raises(KVValueError, match="encoded on the device for 'int8', not 'bf16'"):
        payloads(TorchQuantizer(), export, export.info, "bf16")
    with pytest.raises(KVValueError, match="not 'int8_sym'"):
        DeviceExport(torch.randn(1, 2, 1, 8, 4), "int8_sym")
    with pytest.raises(ValueError, match="kv_export must be one of"):
        EngineConfig(kv_export="int9")


@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["int8", "bf16", "raw", "int8_sym"])
def test_chunks_landed_on_the_device_path_equal_the_host_path(mode, dst_dtype):
    kv = (torch.randn(3, 2, 2, 50, 32) * 3).to(dst_dtype)
    host_out, device_out = land_both(kv, mode, TorchQuantizer(on_device=True), torch.empty_like(kv), CHUNK_BYTES)
    assert torch.equal(device_out, host_out)


def land_both(kv: torch.Tensor, mode: str, device: TorchQuantizer, device_out: torch.Tensor,
              chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every chunk of the reference's payload of `kv`, decoded by the host path into a CPU tensor and
    by `device` into `device_out` (received frames are read-only, as here); both, once landed."""
    info = KVInfo(tuple(kv.shape), "bfloat16" if kv.dtype == torch.bfloat16 else "float32")
    host, host_out = TorchQuantizer(compile=False), torch.empty_like(kv)   # eager: no inductor compile here
    max_rows = max(spec.num_rows for spec in plan_chunks(info, chunk_bytes))
    for spec in plan_chunks(info, chunk_bytes):
        outs = [np.empty(size, np.uint8) for size in max_payload_sizes(mode, max_rows, info)]
        payload = NumpyQuantizer().encode(numpy_of(kv), info, spec, mode, outs)
        frames = [np.frombuffer(bytes(memoryview(np.ascontiguousarray(f)).cast("B")), np.uint8) for f in payload.frames]
        host.decode(frames, info, spec, mode, payload.scale_dtype, host_out)
        device.decode(frames, info, spec, mode, payload.scale_dtype, device_out)
    device.device_landing.synchronize()
    return host_out, device_out


def test_a_chunk_waits_for_its_layers_last_span_and_a_cancel_or_a_timeout_ends_the_wait():
    import threading
    import time

    kv = torch.randn(3, 2, 1, 10, 4)
    export = DeviceExport(kv, "int8")
    waited: list[object] = []
    waiter = threading.Thread(target=lambda: waited.append(export.wait(range(1, 2)) or "landed"))
    waiter.start()
    export.layer_done(0, 0, 10)
    export.layer_done(1, 0, 6)   # not its last span: layer 1 is not complete
    time.sleep(0.05)
    assert not waited
    export.layer_done(1, 6, 10)
    waiter.join(5)
    assert waited == ["landed"]
    with pytest.raises(KVValueError, match="not computed within 0 s"):
        export.wait(range(2, 3), timeout=0.01)
    export.cancel("cancelled by the client")
    with pytest.raises(KVValueError, match="will not be computed: cancelled by the client"):
        export.wait(range(2, 3))
    export.wait(range(0, 2))   # what was computed stays readable
