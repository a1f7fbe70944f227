"""The prefill-side prefix cache: chained keys, LRU within a byte budget, tenants apart, and output
with a cache hit token-identical (and KV bit-identical, float32) to output without one, in whole
and chunked passes, with batches that mix hits and misses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.base import PrefillRequest, SamplingParams
from nodes.engines.kernels import cpu
from nodes.engines.prefix_cache import PrefixCache, block_hashes
from scheduler.prefill_keys import parse_prefill_key, prefill_key
from scheduler.prefix_hashes import route_hash, route_hashes
from tests.nodes.engines.engine_helpers import generate, make_engine

BLOCK = 16
SYSTEM = tuple(range(300, 300 + 70))   # 4 full blocks and 6 tokens


def kv_block(value: float, layers: int = 2) -> torch.Tensor:
    return torch.full((layers, 2, 1, BLOCK, 4), value)


def test_a_key_names_the_whole_prefix_not_the_block():
    a = block_hashes([1] * 16 + [2] * 16, BLOCK)
    b = block_hashes([3] * 16 + [2] * 16, BLOCK)
    assert len(a) == 2 and a[1] != b[1]               # same second block, other first block
    assert block_hashes([1] * 16 + [2] * 15, BLOCK) == a[:1]   # only full blocks get keys
    assert block_hashes([1] * 32, BLOCK, salt="tenant-a") != block_hashes([1] * 32, BLOCK, salt="tenant-b")


def test_match_takes_the_longest_run_of_leading_hits_and_leaves_the_last_token():
    cache = PrefixCache(BLOCK, max_bytes=1 << 20)
    keys = block_hashes(range(64), BLOCK)
    kv = torch.arange(64, dtype=torch.float32).view(1, 1, 1, 64, 1).expand(2, 2, 1, 64, 4).contiguous()
    cache.store(keys, kv)
    assert len(cache.match(keys, 65)) == 4
    assert len(cache.match(keys, 64)) == 3            # the last token's logits are always computed
    other = block_hashes([*range(16), 99, *range(17, 64)], BLOCK)
    assert len(cache.match(other, 65)) == 1           # diverges in block 1
    hits = cache.match(keys, 65)
    assert torch.equal(torch.cat(hits, dim=3), kv)    # copies of the stored KV, in order


def test_the_budget_is_kept_and_tails_go_before_heads():
    block_bytes = kv_block(0).numel() * 4
    cache = PrefixCache(BLOCK, max_bytes=3 * block_bytes)
    first = block_hashes(range(48), BLOCK)
    cache.store(first, torch.zeros(2, 2, 1, 48, 4))
    second = block_hashes(range(1000, 1032), BLOCK)
    cache.store(second, torch.ones(2, 2, 1, 32, 4))
    assert cache.num_bytes <= 3 * block_bytes and cache.num_blocks == 3
    assert len(cache.match(first, 100)) == 1          # the first prompt kept its head, lost its tail
    assert len(cache.match(second, 100)) == 2


def test_an_empty_budget_keeps_nothing():
    cache = PrefixCache(BLOCK, max_bytes=0)
    keys = block_hashes(range(32), BLOCK)
    cache.store(keys, torch.zeros(2, 2, 1, 32, 4))
    assert cache.num_blocks == 0 and cache.match(keys, 100) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=30),
       st.integers(0, 8))
def test_any_sequence_of_stores_and_matches_keeps_the_budget_and_returns_true_prefixes(ops, budget_blocks):
    block_bytes = kv_block(0).numel() * 4
    cache = PrefixCache(BLOCK, max_bytes=budget_blocks * block_bytes)
    for prefix, num_blocks in ops:
        tokens = [prefix] * BLOCK + list(range(BLOCK * (num_blocks - 1)))
        keys = block_hashes(tokens, BLOCK)
        kv = torch.full((2, 2, 1, len(tokens), 4), float(prefix))
        hits = cache.match(keys, len(tokens) + 1)
        assert all(h.shape == (2, 2, 1, BLOCK, 4) for h in hits)
        assert all(float(h[0, 0, 0, 0, 0]) == prefix for h in hits)
        cache.store(keys, kv)
        assert cache.num_bytes <= cache.max_bytes


# -- holdings: what the prefill node reports to the broker ---------------------------------------

def _stored(cache: PrefixCache, tokens, salt: str = "") -> list[bytes]:
    keys = block_hashes(tokens, BLOCK, salt)
    cache.store(keys, torch.zeros(1, 2, 1, len(tokens), 4))
    return keys


def _names(keys: list[bytes], depths) -> list[str]:
    return [f"px.{route_hash(keys[d - 1])}" for d in depths]


def test_holdings_name_the_power_of_two_depths_as_the_routing_key_does():
    cache = PrefixCache(BLOCK, max_bytes=1 << 20)
    prompt = list(range(40 * BLOCK + 5))
    _stored(cache, prompt, "tenant-a")
    held = cache.holdings(24)
    assert list(held.values()) == [16, 32, 64, 128, 256, 512]               # depths 1..32 of 40 blocks
    assert tuple(name[3:] for name in held) == parse_prefill_key(prefill_key(prompt, "tenant-a")).hashes[:6]


def test_holdings_are_bounded_and_most_recently_used_first():
    cache = PrefixCache(BLOCK, max_bytes=1 << 20)
    first, second = _stored(cache, [1] * 64), _stored(cache, [2] * 64)     # 4 blocks: depths 1, 2, 4 each
    assert list(cache.holdings(24)) == _names(second, (1, 2, 4)) + _names(first, (1, 2, 4))
    assert list(cache.holdings(2)) == _names(second, (1, 2)) and cache.holdings(0) == {}
    cache.match(first, 65)                                                  # a hit: first is recent again
    assert list(cache.holdings(3)) == _names(first, (1, 2, 4))
    cache.match(second, 20)                                                 # a hit of one block: its head
    assert list(cache.holdings(2)) == [*_names(second, (1,)), *_names(first, (1,))]


def test_eviction_removes_from_holdings_and_tails_go_first():
    block_bytes = kv_block(0, layers=1).numel() * 4
    cache = PrefixCache(BLOCK, max_bytes=4 * block_bytes)
    first = _stored(cache, [1] * 64)
    second = _stored(cache, [2] * 32)                                       # evicts first's two tail blocks
    assert set(cache.holdings(24)) == set(_names(second, (1, 2)) + _names(first, (1, 2)))
    _stored(cache, [3] * 64)                                                # evicts everything else
    assert set(cache.holdings(24)) == set(_names(block_hashes([3] * 64, BLOCK), (1, 2, 4)))


def test_a_budget_smaller_than_the_prompt_reports_only_the_head_it_kept():
    block_bytes = kv_block(0, layers=1).numel() * 4
    cache = PrefixCache(BLOCK, max_bytes=3 * block_bytes)
    keys = _stored(cache, [1] * 80)                                         # 5 blocks, room for 3
    assert cache.num_blocks == 3 and list(cache.holdings(24)) == _names(keys, (1, 2))


def test_salts_separate_holdings():
    cache = PrefixCache(BLOCK, max_bytes=1 << 20)
    _stored(cache, [1] * 32, "tenant-a")
    _stored(cache, [1] * 32, "tenant-b")
    assert len(cache.holdings(24)) == 4
    assert not set(cache.holdings(24)) & {f"px.{h}" for h in route_hashes([1] * 32)}


def test_nothing_is_reported_when_nothing_can_match_a_routing_key():
    assert PrefixCache(BLOCK, max_bytes=0).holdings(24) == {}
    other = PrefixCache(32, max_bytes=1 << 20)
    other.store(block_hashes([1] * 64, 32), torch.zeros(1, 2, 1, 64, 4))
    assert other.num_blocks == 2 and other.holdings(24) == {}                # 32-token blocks: other keys


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 9), st.booleans()), min_size=1, max_size=30),
       st.integers(0, 12), st.integers(0, 30))
def test_holdings_only_ever_name_held_blocks_within_the_limit(ops, budget_blocks, limit):
    cache = PrefixCache(BLOCK, max_bytes=budget_blocks * kv_block(0, layers=1).numel() * 4)
    held_names: dict[str, bytes] = {}
    for prefix, num_blocks, is_match in ops:
        keys = block_hashes([prefix] * BLOCK + list(range(BLOCK * (num_blocks - 1))), BLOCK)
        held_names.update({f"px.{route_hash(k)}": k for k in keys})
        if is_match:
            cache.match(keys, len(keys) * BLOCK + 1)
        else:
            cache.store(keys, torch.zeros(1, 2, 1, len(keys) * BLOCK, 4))
        held = cache.holdings(limit)
        assert len(held) <= limit
        assert all(held_names[name] in cache._blocks for name in held)
        assert all(tokens in (16, 32, 64, 128) for tokens in held.values())


def requests(prompts, salt: str = "", max_tokens: int = 1) -> list[PrefillRequest]:
    return [PrefillRequest(f"r{i}", tuple(p), SamplingParams(temperature=0.0, max_tokens=max_tokens), cache_salt=salt)
            for i, p in enumerate(prompts)]


def test_a_hit_gives_the_same_first_token_and_kv_as_no_cache(tiny_model):
    prompts = [SYSTEM + (5, 6, 7), SYSTEM + (8, 9), (1, 2, 3) * 10]
    cold = make_engine(tiny_model, prefix_cache_bytes=0).prefill(requests(prompts))
    warm = make_engine(tiny_model)
    warm.prefill(requests([SYSTEM + (11,)]))            # fills the cache with SYSTEM's 4 blocks
    hit = warm.prefill(requests(prompts))                # a batch of two hits and a miss
    assert [r.num_cached_tokens for r in hit] == [64, 64, 0]
    for a, b in zip(cold, hit, strict=True):
        assert a.first_token_id == b.first_token_id
        assert torch.equal(a.kv, b.kv)


def test_chunked_passes_use_the_cache_too(tiny_model):
    prompts = [SYSTEM + (5, 6, 7), (9,) * 40]
    cold = make_engine(tiny_model, prefix_cache_bytes=0).prefill(requests(prompts))
    warm = make_engine(tiny_model)
    warm.prefill(requests([SYSTEM]))
    before = warm.stats.num_prefilled_tokens
    prefill = warm.start_prefill(requests(prompts), chunk_tokens=8)
    results = {}
    while not prefill.done:
        results.update({r.request_id: r for r in prefill.step()})
    assert results["r0"].num_cached_tokens == 64 and results["r1"].num_cached_tokens == 0
    assert warm.stats.num_prefilled_tokens - before == len(prompts[0]) - 64 + len(prompts[1])
    for i, a in enumerate(cold):
        # Steps of 8 rows take float32's linear kernel, a whole pass MKL: sums in another order.
        assert a.first_token_id == results[f"r{i}"].first_token_id
        torch.testing.assert_close(results[f"r{i}"].kv, a.kv, rtol=1e-4, atol=1e-5)


def test_tenants_do_not_share_cached_prefixes(tiny_model):
    engine = make_engine(tiny_model)
    engine.prefill(requests([SYSTEM], salt="tenant-a"))
    assert engine.prefill(requests([SYSTEM + (1,)], salt="tenant-b"))[0].num_cached_tokens == 0
    assert engine.prefill(requests([SYSTEM + (1,)], salt="tenant-a"))[0].num_cached_tokens == 64


def test_the_whole_generation_is_unchanged_by_a_hit(tiny_model):
    """Prefill with a hit, then the decode side continues from the exported KV: the same tokens."""
    prompt = SYSTEM + (42, 43)
    expected = generate(make_engine(tiny_model, prefix_cache_bytes=0), prompt)
    engine = make_engine(tiny_model)
    engine.prefill(requests([SYSTEM]))
    assert engine.prefill(requests([prompt]))[0].num_cached_tokens == 64
    assert generate(engine, prompt) == expected


# torch's oneDNN on AMX tiles picks its bf16 GEMM kernel by the number of rows, so a prompt's last
# rows can round differently when a hit leaves only them to compute (its other paths do not).
ONEDNN_ON_TILES = cpu.onednn_on_tiles()


@pytest.mark.real_model
def test_in_bf16_a_hit_leaves_the_kv_bit_identical_on_the_real_model(smollm2):
    """A hit leaves a few rows to compute where the whole prompt had hundreds: prompts' rows never
    take pdbus's row-count-dependent linear kernels (llama.forward_eager), so the bits do not move,
    except where oneDNN itself multiplies on AMX tiles: there the computed rows agree to bf16
    rounding and the first token is the same."""
    system = tuple(range(300, 800))
    prompt = system + (5, 6, 7)
    cold = make_engine(smollm2, dtype="bfloat16", prefix_cache_bytes=0).prefill(requests([prompt]))[0]
    warm = make_engine(smollm2, dtype="bfloat16")
    warm.prefill(requests([system]))
    hit = warm.prefill(requests([prompt]))[0]
    assert hit.num_cached_tokens == 496
    assert hit.first_token_id == cold.first_token_id
    if not ONEDNN_ON_TILES:
        assert torch.equal(hit.kv, cold.kv)
        return
    cached = hit.num_cached_tokens
    assert torch.equal(hit.kv[..., :cached, :], cold.kv[..., :cached, :])   # copied blocks: the same bits
    computed, reference = hit.kv[..., cached:, :].float(), cold.kv[..., cached:, :].float()
    assert (computed - reference).abs().max() <= 0.05 * reference.abs().max()


def test_a_bad_budget_or_block_size_is_a_clear_error():
    for block_size, max_bytes in ((0, 1024), (16, -1)):
        with pytest.raises(ValueError, match="prefix cache"):
            PrefixCache(block_size, max_bytes)
