"""The copy between vLLM's paged KV and pdbus's KV layout, on synthetic caches (no vLLM needed).

The CPU kernels' in-block orders are stood in for by writers that do what the real ones were seen to
do (plain rows, keys transposed, AMX-style channel pairs per token); the probe must recover each.
"""

from __future__ import annotations

import pytest
import torch

from nodes.engines.vllm_kv import KvLayoutError, gather, paged_layout, probe_cpu_order, scatter

BLOCK, DIM, HEADS, LAYERS = 32, 16, 3, 2


def _writer(order_of):
    """A cache writer placing (token, channel) of each slot at `order_of(t, d)` in its block region."""
    def write(keys, values, key_cache, value_cache, slot_mapping):
        for source, cache in ((keys, key_cache), (values, value_cache)):
            num_blocks, heads, block, dim = cache.shape
            # the (block, head) region as one flat run, as the kernels address it
            region = cache.as_strided((num_blocks, heads, block * dim), cache.stride()[:2] + (1,))
            for slot, row in zip(slot_mapping.tolist(), source, strict=True):
                b, t = divmod(slot, block)
                for d in range(dim):
                    region[b, :, order_of(t, d, block, dim)] = row[:, d]
    return write


def plain(t, d, block, dim):
    return t * dim + d


def transposed(t, d, block, dim):
    return d * block + t


def amx_pairs(t, d, block, dim):
    return (d // 2) * block * 2 + t * 2 + d % 2


@pytest.mark.parametrize("order_of", [plain, transposed, amx_pairs])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probe_recovers_the_kernels_order(order_of, dtype):
    key_order, value_order = probe_cpu_order(_writer(order_of), BLOCK, DIM, dtype)
    expected = torch.tensor([order_of(t, d, BLOCK, DIM) for t in range(BLOCK) for d in range(DIM)])
    assert torch.equal(key_order, expected) and torch.equal(value_order, expected)


def test_a_writer_that_drops_or_merges_positions_is_refused():
    with pytest.raises(KvLayoutError, match="not a permutation"):
        probe_cpu_order(_writer(lambda t, d, block, dim: t * dim), BLOCK, DIM, torch.float32)


def _cpu_cache(order_of, num_blocks=8, dtype=torch.float32):
    layers = [torch.randn(num_blocks, HEADS, BLOCK, 2 * DIM).to(dtype) for _ in range(LAYERS)]
    order = probe_cpu_order(_writer(order_of), BLOCK, DIM, dtype)
    return layers, paged_layout(layers[0], HEADS, DIM, order)


def _kv(num_tokens, dtype=torch.float32):
    return torch.randn(LAYERS, 2, HEADS, num_tokens, DIM).to(dtype)


@pytest.mark.parametrize("order_of", [plain, transposed, amx_pairs])
def test_scatter_then_gather_round_trips_through_scattered_blocks(order_of):
    layers, layout = _cpu_cache(order_of)
    block_ids = [5, 1, 6]                       # not in order, not contiguous
    kv = _kv(70)                                # two full blocks and part of a third
    scatter(layers, block_ids, kv, 0, layout)
    assert torch.equal(gather(layers, block_ids, 70, layout), kv)


def test_the_logical_view_matches_what_the_kernel_wrote():
    layers, layout = _cpu_cache(amx_pairs, num_blocks=2)
    keys, values = torch.randn(BLOCK, 1, DIM).expand(BLOCK, HEADS, DIM), torch.randn(BLOCK, HEADS, DIM)
    halves = layers[0].view(2, HEADS, 2 * BLOCK, DIM)
    _writer(amx_pairs)(keys, values, halves[:, :, :BLOCK], halves[:, :, BLOCK:], BLOCK + torch.arange(BLOCK))
    got = gather(layers[:1], [1], BLOCK, layout)[0]
    assert torch.equal(got[0], keys.transpose(0, 1)) and torch.equal(got[1], values.transpose(0, 1))


def test_scatter_from_an_offset_leaves_the_blocks_other_tokens_alone():
    layers, layout = _cpu_cache(transposed)
    block_ids = [2, 3]
    before = gather(layers, block_ids, 2 * BLOCK, layout)
    suffix = _kv(20)
    scatter(layers, block_ids, suffix, 10, layout)
    after = gather(layers, block_ids, 2 * BLOCK, layout)
    assert torch.equal(after[:, :, :, 10:30], suffix)
    assert torch.equal(after[:, :, :, :10], before[:, :, :, :10]) and torch.equal(after[:, :, :, 30:], before[:, :, :, 30:])
    untouched = gather(layers, [0, 1, 4, 5, 6, 7], 6 * BLOCK, layout)
    assert torch.isfinite(untouched).all()


def test_bf16_cache_takes_fp32_kv_cast_to_its_dtype():
    layers, layout = _cpu_cache(amx_pairs, dtype=torch.bfloat16)
    kv = _kv(40)
    scatter(layers, [0, 1], kv, 0, layout)
    assert torch.equal(gather(layers, [0, 1], 40, layout), kv.to(torch.bfloat16))


def test_nhd_layout_round_trips():
    layers = [torch.randn(2, 6, BLOCK, HEADS, DIM) for _ in range(LAYERS)]
    layout = paged_layout(layers[0], HEADS, DIM)
    kv = _kv(45)
    scatter(layers, [4, 0], kv, 0, layout)
    assert layout.kind == "nhd" and torch.equal(gather(layers, [4, 0], 45, layout), kv)


def test_mismatches_raise_the_layout_error_and_write_nothing():
    layers, layout = _cpu_cache(plain)
    snapshot = [layer.clone() for layer in layers]
    with pytest.raises(KvLayoutError, match="do not fit"):
        scatter(layers, [0], _kv(BLOCK + 1), 0, layout)          # one block is too few
    with pytest.raises(KvLayoutError, match="does not fit a cache"):
        scatter(layers, [0, 1], torch.randn(LAYERS, 2, HEADS + 1, 4, DIM), 0, layout)
    with pytest.raises(KvLayoutError, match="does not fit a cache"):
        scatter(layers[:1], [0, 1], _kv(4), 0, layout)
    assert all(torch.equal(a, b) for a, b in zip(layers, snapshot, strict=True))
    with pytest.raises(KvLayoutError, match="unsupported paged KV layer shape"):
        paged_layout(torch.zeros(4, HEADS + 1, BLOCK, 2 * DIM), HEADS, DIM)
    with pytest.raises(KvLayoutError, match="needs the kernel's element order"):
        paged_layout(layers[0], HEADS, DIM)
