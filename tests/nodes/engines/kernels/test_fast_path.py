"""The bf16 path on the kernels (kernels/fast_path.py, with its matrices on AMX tiles
(linear/amx.py), on vdpbf16ps outer products (linear/dot_bf16.py), or its linear layers on oneDNN)
against the torch/oneDNN path it replaces for
steps of few rows: same results up to float32 summation order (then bf16 rounding), the KV it
writes, and the fallbacks when AMX or numba cannot run."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.forward_batch import DecodeGroup, ForwardBatch, PrefillSpan
from nodes.engines.kernels import amx_tiles, dispatch
from nodes.engines.kernels.decode_attention import bf16 as decode_bf16
from nodes.engines.kernels.jit import NUMBA
from nodes.engines.kernels.linear import amx as amx_linear
from nodes.engines.kernels.linear import dot_bf16 as bf16_dot
from nodes.engines.llama import LlamaRunner

pytestmark = pytest.mark.skipif(not NUMBA, reason="numba is not installed")


MAX_ROWS = {"amx": amx_tiles.MAX_ROWS, "dot_bf16": dispatch.DOT_MAX_ROWS, "torch": 0}


@pytest.fixture(params=["amx", "dot_bf16", "torch"])
def backend(request, monkeypatch, fresh_dispatch) -> str:
    """Each test runs with the matrices on AMX tiles (where this CPU has them), on the vdpbf16ps
    outer products (where it has AVX512-BF16), and with the linear layers on oneDNN (everywhere
    numba runs: the attention, norm and RoPE kernels still serve)."""
    if request.param == "amx" and not amx_tiles.AVAILABLE:
        pytest.skip("no AMX on this CPU")
    if request.param == "dot_bf16" and not bf16_dot.AVAILABLE:
        pytest.skip("no AVX512-BF16 on this CPU")
    monkeypatch.setattr(dispatch, "_bf16_linear", lambda: (request.param, MAX_ROWS[request.param]))
    return request.param


def runners(model, backend: str) -> tuple[LlamaRunner, LlamaRunner]:
    fast = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=256)
    plain = LlamaRunner(model.config, model.weights, dtype=torch.bfloat16, max_len=256, use_kernels=False)
    assert fast.fast_path is not None and plain.fast_path is None
    assert fast.fast_path.plan.linear == backend
    assert fast.fast_path.max_rows == MAX_ROWS[backend]
    return fast, plain


def assert_bf16_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # A few bf16 steps of the values' scale: what reordering float32 sums can move after rounding.
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual.float(), expected.float(), atol=0.04 * scale, rtol=0.0)


def assert_same_choice(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The same greedy token in every row whose top-2 margin is wider than the two paths may part
    by (twice assert_bf16_close's tolerance): the tiny model's random logits have near-ties, where
    either choice is right."""
    top2 = expected.float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.08 * float(expected.abs().max())
    assert torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])


@pytest.mark.parametrize("num_tokens", [1, 2, 3, 4, 5, dispatch.DOT_MAX_ROWS,
                                        dispatch.DOT_MAX_ROWS + 1, 17, amx_tiles.MAX_ROWS, amx_tiles.MAX_ROWS + 1])
def test_small_prefill_through_the_kernels_matches_onednn(tiny_model, backend, num_tokens):
    """Up to max_rows tokens on the kernels (one or two AMX row tiles, padded), above on oneDNN."""
    fast, plain = runners(tiny_model, backend)
    ids = torch.arange(5, 5 + num_tokens)
    results = []
    for runner in (fast, plain):
        kv = runner.new_kv(40)
        batch = ForwardBatch(ids, torch.arange(num_tokens), torch.arange(num_tokens),
                             spans=[PrefillSpan(0, num_tokens, 0, kv)])
        results.append((runner.forward(batch), kv[:, :, :, :num_tokens]))
    (fast_logits, fast_kv), (plain_logits, plain_kv) = results
    assert_bf16_close(fast_logits, plain_logits)
    assert_bf16_close(fast_kv, plain_kv)
    assert_same_choice(fast_logits, plain_logits)


def decode_batch(cache: torch.Tensor, positions: list[int], slots: list[int]) -> ForwardBatch:
    num_slots = cache.shape[1]
    lengths = torch.ones(num_slots, dtype=torch.long)
    lengths[slots] = torch.tensor(positions) + 1
    max_len = int(lengths.max())
    rows = torch.arange(len(slots))
    group = DecodeGroup(rows=rows, slots=torch.tensor(slots), positions=torch.tensor(positions), cache=cache,
                        num_slots=num_slots, lengths=lengths, max_len=max_len, dense=slots == list(range(num_slots)))
    ids = torch.tensor([7, 11, 13, 17, 19, 23] * (len(slots) // 6 + 1))[:len(slots)]
    return ForwardBatch(ids, torch.tensor(positions), rows, decode=group)


@pytest.mark.parametrize("slots", [[0], [0, 1, 2], [2, 0]])
def test_decode_attention_kernel_matches_sdpa_and_writes_the_same_kv(tiny_model, backend, slots):
    """Slots of different lengths (no mask in the kernel: each row reads its own keys 0..position),
    and a non-dense step where slot 1 idles."""
    fast, plain = runners(tiny_model, backend)
    c = tiny_model.config
    positions = [9, 30, 17][:len(slots)]
    cache = (torch.randn(c.num_layers, 3, 2, c.num_kv_heads, 40, c.head_dim) * 0.5).to(torch.bfloat16)
    caches = [cache.clone(), cache.clone()]
    fast_logits = fast.forward(decode_batch(caches[0], positions, slots))
    plain_logits = plain.forward(decode_batch(caches[1], positions, slots))
    assert_bf16_close(fast_logits, plain_logits)
    assert_bf16_close(caches[0], caches[1])
    untouched = torch.ones_like(cache, dtype=torch.bool)
    for slot, position in zip(slots, positions, strict=True):
        untouched[:, slot, :, :, position] = False
    assert torch.equal(caches[0][untouched], cache[untouched])   # only each row's own position written


def test_decode_steps_above_the_gemv_rows_still_take_the_attention_kernel(tiny_model, backend):
    """One row more than the kernels take: oneDNN's GEMMs for the linear layers, the numba attention
    (not SDPA); same logits and KV as SDPA's path."""
    fast, plain = runners(tiny_model, backend)
    c = tiny_model.config
    num_rows = fast.fast_path.max_rows + 1
    slots, positions = list(range(num_rows)), [(7 * i + 9) % 38 + 1 for i in range(num_rows)]
    cache = (torch.randn(c.num_layers, num_rows, 2, c.num_kv_heads, 40, c.head_dim) * 0.5).to(torch.bfloat16)
    caches = [cache.clone(), cache.clone()]
    calls = []
    kernel = fast.fast_path.decode_attention
    fast.fast_path.decode_attention = lambda *args: calls.append(args[1].shape[0]) or kernel(*args)
    fast_logits = fast.forward(decode_batch(caches[0], positions, slots))
    plain_logits = plain.forward(decode_batch(caches[1], positions, slots))
    assert calls == [num_rows] * c.num_layers
    assert_bf16_close(fast_logits, plain_logits)
    assert_bf16_close(caches[0], caches[1])
    assert_same_choice(fast_logits, plain_logits)


def test_consecutive_steps_reuse_buffers_without_corrupting_results(tiny_model, backend):
    """Reused output buffers and the in-place residual: step after step the results still match
    the oneDNN path, and what an earlier step returned is not overwritten by a later one."""
    fast, plain = runners(tiny_model, backend)
    c = tiny_model.config
    cache = (torch.randn(c.num_layers, 2, 2, c.num_kv_heads, 40, c.head_dim) * 0.5).to(torch.bfloat16)
    caches, returned = [cache.clone(), cache.clone()], []
    for step, positions in enumerate(([9, 20], [10, 21], [11, 22])):
        fast_logits = fast.forward(decode_batch(caches[0], positions, [0, 1]))
        plain_logits = plain.forward(decode_batch(caches[1], positions, [0, 1]))
        assert_bf16_close(fast_logits, plain_logits)
        returned.append((fast_logits, fast_logits.clone()))
        one = fast.forward(decode_batch(caches[0].clone(), [5 + step], [0]))   # another row count between
        assert one.shape == (1, c.vocab_size)
    assert_bf16_close(caches[0], caches[1])
    assert all(torch.equal(kept, copy) for kept, copy in returned)


def test_without_numba_or_with_a_failing_compiler_the_runner_keeps_onednn(tiny_model, monkeypatch, fresh_dispatch):
    """(A process without numba: tests/nodes/engines/kernels/test_cpu_paths.py runs one.)"""

    def broken() -> None:
        raise RuntimeError("no compiler")
    monkeypatch.setattr(decode_bf16, "warmup", broken)
    runner = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16, max_len=64)
    assert runner.fast_path is None
    kv = runner.new_kv(8)
    logits = runner.forward(ForwardBatch(torch.tensor([5]), torch.tensor([0]), torch.tensor([0]),
                                         spans=[PrefillSpan(0, 1, 0, kv)]))
    assert logits.shape == (1, tiny_model.config.vocab_size)


@pytest.mark.skipif(not amx_tiles.AVAILABLE, reason="no AMX on this CPU")
def test_when_the_amx_kernels_fail_to_compile_the_next_choice_serves(tiny_model, monkeypatch, fresh_dispatch):
    def broken() -> None:
        raise RuntimeError("LLVM cannot select tdpbf16ps")
    monkeypatch.setattr(amx_linear, "warmup", broken)
    runner = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16, max_len=64)
    expected = "dot_bf16" if bf16_dot.AVAILABLE else "torch"
    assert runner.fast_path is not None and runner.fast_path.plan.linear == expected
    assert runner.fast_path.max_rows == MAX_ROWS[expected]


@pytest.mark.skipif(not bf16_dot.AVAILABLE, reason="no AVX512-BF16 on this CPU")
def test_when_the_vdpbf16ps_kernels_fail_to_compile_onednn_takes_the_linear_layers(tiny_model, monkeypatch,
                                                                                   fresh_dispatch):
    def broken() -> None:
        raise RuntimeError("no asm parser for vdpbf16ps")
    monkeypatch.setattr(amx_tiles, "AVAILABLE", False)
    monkeypatch.setattr(bf16_dot, "warmup", broken)
    runner = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16, max_len=64)
    assert runner.fast_path is not None and runner.fast_path.plan.linear == "torch"
    assert runner.fast_path.max_rows == 0 and not runner.fast_path.takes_rows(1)


def test_float32_never_takes_the_bf16_kernels(tiny_model):
    assert LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.float32).fast_path is None
