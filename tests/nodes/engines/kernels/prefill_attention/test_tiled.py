"""Causal prefill attention on AMX tiles (or soft_tiles, their AVX512-BF16 emulation, on a CPU without
AMX) against a float64 reference: GQA groups, spans that start
at 0 and after earlier tokens (chunked prefill), row counts around the 16-query blocks, and cache
slots past the span that hold NaN (never read into a result); its workspace; and the runner's bf16
prefill on it against SDPA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nodes.engines.forward_batch import DecodeGroup, ForwardBatch, PrefillSpan
from nodes.engines.kernels.fast_path import bits
from nodes.engines.kernels.prefill_attention import tiled as amx_attention
from nodes.engines.llama import LlamaRunner
from nodes.engines.model_loader import build_tiny_model

pytestmark = pytest.mark.skipif(not amx_attention.can_attend(9, 3, 64), reason="no AMX or AVX512-BF16 on this CPU (or numba missing)")



def bf16(values: np.ndarray) -> np.ndarray:
    return bits(torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16))


def f64(bits_: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits_.view(np.int16)).view(torch.bfloat16).double().numpy()


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int) -> np.ndarray:
    heads, rows, dim = q.shape
    group = heads // keys.shape[0]
    out = np.empty((rows, heads * dim))
    for h in range(heads):
        k, v = f64(keys[h // group]), f64(values[h // group])
        for i in range(rows):
            scores = k[:start + i + 1] @ f64(q[h, i]) / np.sqrt(dim)
            weights = np.exp(scores - scores.max())
            out[i, h * dim:(h + 1) * dim] = weights @ v[:start + i + 1] / weights.sum()
    return out


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(9, 3), (4, 2), (2, 2)])
@pytest.mark.parametrize(("start", "rows"), [(0, 1), (0, 16), (0, 40), (7, 5), (33, 17), (16, 32)])
def test_prefill_attention_matches_a_float64_reference(num_heads, num_kv_heads, start, rows):
    rng = np.random.default_rng(start * 100 + rows + num_heads)
    capacity = start + rows + 20
    cache = rng.normal(size=(2, num_kv_heads, capacity, 64)) * 2
    cache[:, :, start + rows:] = np.nan   # past the span: must never reach a result
    cache_bits = bf16(cache)
    q = bf16(rng.normal(size=(num_heads, rows, 64)) * 2)
    out = np.empty((rows, num_heads * 64), np.uint16)
    amx_attention.prefill_attention(q, cache_bits[0], cache_bits[1], start, out, amx_attention.Workspace(capacity))
    expected = reference(q, cache_bits[0], cache_bits[1], start)
    actual = f64(out)
    assert np.isfinite(actual).all()
    np.testing.assert_allclose(actual, expected, atol=2e-2 * np.abs(expected).max() + 1e-3)


def test_only_head_dim_64_with_whole_groups_is_served():
    assert amx_attention.can_attend(9, 3, 64)
    assert not amx_attention.can_attend(9, 3, 128) and not amx_attention.can_attend(9, 4, 64)


def test_a_workspace_too_small_for_the_span_is_refused():
    q = np.zeros((2, 8, 64), np.uint16)
    cache = np.zeros((2, 1, 16, 64), np.uint16)
    with pytest.raises(AssertionError, match="workspace is smaller"):
        amx_attention.prefill_attention(q, cache[0], cache[1], 4, np.zeros((8, 128), np.uint16),
                                        amx_attention.Workspace(8))


def head_dim_64_model():
    return build_tiny_model(seed=3, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256)


def prefill(runner: LlamaRunner, ids: torch.Tensor, chunks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt in consecutive spans of the given sizes; the last span's logits and the KV."""
    kv = runner.new_kv(len(ids) + 8)
    start = 0
    for size in chunks:
        rows = torch.arange(size)
        batch = ForwardBatch(ids[start:start + size], start + rows, rows[-1:],
                             spans=[PrefillSpan(0, size, start, kv)])
        logits = runner.forward(batch)
        start += size
    return logits, kv[:, :, :, :start]


@pytest.mark.parametrize("chunks", [[40], [24, 17], [5, 1, 33]])
def test_the_runner_attends_on_tiles_as_sdpa_does(chunks):
    """bf16 prefill of a head_dim-64 model, whole and in chunks: the tile kernel against SDPA."""
    model = head_dim_64_model()
    tiles = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=128)
    sdpa = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=128)
    assert tiles.fast_path is not None and tiles.fast_path.attends
    sdpa.fast_path.attends = False
    ids = torch.arange(7, 7 + sum(chunks)) % model.config.vocab_size
    (logits, kv), (expected_logits, expected_kv) = prefill(tiles, ids, chunks), prefill(sdpa, ids, chunks)
    scale = float(expected_logits.abs().max())
    torch.testing.assert_close(logits, expected_logits, atol=0.04 * scale, rtol=0.0)
    assert torch.equal(logits.argmax(-1), expected_logits.argmax(-1))
    torch.testing.assert_close(kv.float(), expected_kv.float(), atol=0.04 * float(expected_kv.abs().max()), rtol=0.0)


def test_a_longer_span_grows_the_workspace():
    model = head_dim_64_model()
    runner = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=2048)
    ids = torch.arange(1100) % model.config.vocab_size
    prefill(runner, ids[:10], [10])
    assert runner.fast_path._workspace.num_keys == 1024
    prefill(runner, ids, [1100])
    assert runner.fast_path._workspace.num_keys == 2048


def test_a_prefill_beside_decode_rows_attends_with_the_same_kernel():
    """A recovery prefill on a decode node shares its steps with decode rows (the unfused path): its
    KV and logits must be those of the same prompt prefilled alone, or failover changes bf16 texts."""
    model = head_dim_64_model()
    c = model.config
    runner = LlamaRunner(c, model.weights, dtype=torch.bfloat16, max_len=128)
    ids = torch.arange(7, 47) % c.vocab_size
    alone_logits, alone_kv = prefill(runner, ids, [40])
    kv = runner.new_kv(48)
    slot_cache = (torch.randn(c.num_layers, 1, 2, c.num_kv_heads, 16, c.head_dim) * 0.5).to(torch.bfloat16)
    decode = DecodeGroup(rows=torch.tensor([40]), slots=torch.tensor([0]), positions=torch.tensor([9]),
                         cache=slot_cache, num_slots=1, lengths=None, max_len=10, dense=True)
    batch = ForwardBatch(torch.cat([ids, torch.tensor([5])]), torch.cat([torch.arange(40), torch.tensor([9])]),
                         torch.tensor([39, 40]), spans=[PrefillSpan(0, 40, 0, kv)], decode=decode)
    mixed_logits = runner.forward(batch)
    assert torch.equal(kv[:, :, :, :40], alone_kv)
    assert torch.equal(mixed_logits[0], alone_logits[0])


def test_when_the_attention_kernel_fails_to_compile_sdpa_and_the_gemvs_serve(monkeypatch, fresh_dispatch):
    """A compiler that cannot build the tile attention leaves the runner on SDPA (and the GEMVs),
    prefill results unchanged in kind."""
    def broken() -> None:
        raise RuntimeError("LLVM cannot select vcvtneps2bf16")
    monkeypatch.setattr(amx_attention, "warmup", broken)
    model = head_dim_64_model()
    runner = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=64)
    assert runner.fast_path is not None and not runner.fast_path.attends
    assert runner.fast_path.plan.prefill_attention == "torch"    # SDPA; the linear layers keep their kernels
    logits, _ = prefill(runner, torch.arange(7, 47) % model.config.vocab_size, [40])
    assert torch.isfinite(logits).all()
