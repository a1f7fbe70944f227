"""The bf16 prefill kernels (nodes/engines/bf16_prefill.py) against the torch ops they replace:
RMSNorm and RoPE bit for bit, the KV they write, and the runner's prefill through them."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.forward_batch import ForwardBatch, PrefillSpan
from nodes.engines.kernels.fast_path import bits
from nodes.engines.kernels.jit import NUMBA
from nodes.engines.kernels.norm_rope import bf16 as bf16_prefill
from nodes.engines.kernels.norm_rope import rows as prefill_rows
from nodes.engines.llama import LlamaRunner
from nodes.engines.llama_ops import apply_rope, rms_norm

pytestmark = pytest.mark.skipif(not NUMBA, reason="numba is not installed")


# 576 and head_dim 64 take the vector rows of prefill_rows.py where this CPU has them; 72 and 16 (a
# half head of 8) the scalar loops.
@pytest.mark.parametrize("width", [576, 72])
def test_rms_norm_is_bit_identical_to_the_torch_branch(width):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(300, width, generator=g) * 3).to(torch.bfloat16)
    weight = torch.randn(width, generator=g).to(torch.bfloat16)
    out = torch.empty_like(x)
    bf16_prefill.rms_norm(bits(x), bits(weight), 1e-5, bits(out))
    assert torch.equal(out, rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("head_dim", [64, 16])
@pytest.mark.parametrize("start", [0, 7])
def test_rope_and_cache_match_apply_rope_and_the_cache_copies(start, head_dim):
    g = torch.Generator().manual_seed(start)
    heads, kv_heads, tokens = 9, 3, 33
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(torch.bfloat16)
    cos = torch.randn(64, head_dim, generator=g).to(torch.bfloat16)
    sin = torch.randn(64, head_dim, generator=g).to(torch.bfloat16)
    cache = torch.randn(4, 2, kv_heads, 64, head_dim, generator=g).to(torch.bfloat16)
    before = cache.clone()
    q = torch.empty(heads, tokens, head_dim, dtype=torch.bfloat16)
    bf16_prefill.rope_and_cache(bits(qkv), bits(cos), bits(sin), start, heads, bits(q), bits(cache[2]))
    positions = torch.arange(start, start + tokens)
    qk = apply_rope(qkv[:, :(heads + kv_heads) * head_dim].view(tokens, -1, head_dim),
                    cos[positions][:, None, :], sin[positions][:, None, :])
    assert torch.equal(q, qk[:, :heads].transpose(0, 1))
    span = slice(start, start + tokens)
    assert torch.equal(cache[2, 0, :, span], qk[:, heads:].transpose(0, 1))
    v = qkv[:, (heads + kv_heads) * head_dim:].view(tokens, kv_heads, head_dim)
    assert torch.equal(cache[2, 1, :, span], v.transpose(0, 1))
    untouched = torch.ones_like(cache, dtype=torch.bool)
    untouched[2, :, :, span] = False
    assert torch.equal(cache[untouched], before[untouched])   # other layers and positions kept


def test_the_vector_rows_take_the_real_model_widths_where_the_cpu_has_them():
    if prefill_rows.AVAILABLE:
        assert prefill_rows.can_take(576) and prefill_rows.can_take(32)
    assert not prefill_rows.can_take(72) and not prefill_rows.can_take(8)


def test_a_chunked_prefill_through_the_kernels_matches_the_torch_ops(tiny_model):
    """Two spans of a prompt (the second attends over the first's cached KV) give the same logits
    and KV through the kernels as through the torch ops."""
    fused = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16, max_len=128)
    plain = LlamaRunner(tiny_model.config, tiny_model.weights, dtype=torch.bfloat16, max_len=128)
    plain.fused = False
    assert fused.fused
    results = []
    for runner in (fused, plain):
        kv = runner.new_kv(64)
        logits = []
        for start, count in ((0, 20), (20, 13)):
            ids = torch.arange(5 + start, 5 + start + count)
            batch = ForwardBatch(ids, torch.arange(start, start + count), torch.tensor([count - 1]),
                                 spans=[PrefillSpan(0, count, start, kv)])
            logits.append(runner.forward(batch))
        results.append((torch.cat(logits), kv[:, :, :, :33]))
    (fused_logits, fused_kv), (plain_logits, plain_kv) = results
    c = tiny_model.config
    qkv = torch.zeros(5, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, dtype=torch.bfloat16)
    q = fused.fast_path.rope_and_cache(qkv, 0, c.num_heads, fused.new_kv(8)[0])
    assert q.shape == (c.num_heads, 5, c.head_dim) and q.is_contiguous()   # SDPA's layout
    assert torch.equal(fused_kv, plain_kv)
    assert torch.equal(fused_logits, plain_logits)
