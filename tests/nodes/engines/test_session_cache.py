"""The decode engine's kept KV (plain data): LRU by id, the block-key index and its longest match
(against a brute force, by hypothesis), re-keying, and the shared-prefix counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.prefix_cache import block_hashes
from nodes.engines.prefix_leases import DecodePrefixes
from nodes.engines.session_cache import CachedSession, SessionCache, SharedPrefixes, common_prefix_len

BLOCK = 4


def entry(name, tokens, salt=""):
    return CachedSession(name, tuple(tokens), None, salt, tuple(block_hashes(tokens, BLOCK, salt)))


def test_session_cache_is_lru_and_put_refreshes():
    cache = SessionCache(BLOCK)
    for name in "abc":
        cache.put(CachedSession(name, (1, 2), None))
    cache.put(CachedSession("a", (1, 2, 3), None))
    assert cache.lru_order() == ["b", "c", "a"]
    assert cache.take("b").session_id == "b"
    assert "b" not in cache and len(cache) == 2
    cache.touch("c")
    assert cache.lru_order() == ["a", "c"]


def test_longest_finds_the_entry_with_most_leading_blocks():
    cache = SessionCache(BLOCK)
    cache.put(entry("short", range(8)))
    cache.put(entry("long", list(range(12)) + [99]))
    prompt = tuple(range(16))
    found, blocks = cache.longest(block_hashes(prompt, BLOCK), prompt)
    assert found.session_id == "long" and blocks == 3
    cache.take("long")
    found, blocks = cache.longest(block_hashes(prompt, BLOCK), prompt)
    assert found.session_id == "short" and blocks == 2
    assert cache.longest(block_hashes((7, 7, 7, 7), BLOCK), (7, 7, 7, 7)) == (None, 0)
    assert not cache.holds_key(block_hashes(range(12), BLOCK)[-1])


def test_a_replaced_entry_leaves_no_key_behind():
    cache = SessionCache(BLOCK)
    cache.put(entry("s", range(8)))
    cache.put(entry("s", range(100, 108)))
    prompt = tuple(range(9))
    assert cache.longest(block_hashes(prompt, BLOCK), prompt) == (None, 0)


def test_rekey_keeps_the_entry_and_its_keys():
    cache = SessionCache(BLOCK)
    kept = entry("s", range(8))
    cache.put(kept)
    cache.rekey(kept, "prefix:0")
    prompt = tuple(range(9))
    assert "s" not in cache and cache.get("prefix:0") is kept
    assert cache.longest(block_hashes(prompt, BLOCK), prompt) == (kept, 2)


def test_a_colliding_key_with_other_tokens_is_not_a_match():
    cache = SessionCache(BLOCK)
    liar = CachedSession("liar", (9, 9, 9, 9), None, "", tuple(block_hashes(range(4), BLOCK)))
    cache.put(liar)
    prompt = tuple(range(5))
    assert cache.longest(block_hashes(prompt, BLOCK), prompt) == (None, 0)


prompts = st.lists(st.integers(0, 2), min_size=0, max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.lists(prompts, max_size=6), prompts, st.lists(st.integers(0, 5), max_size=3))
def test_longest_equals_a_brute_force(kept, prompt, taken):
    cache = SessionCache(BLOCK)
    for i, tokens in enumerate(kept):
        cache.put(entry(str(i), tokens))
    for i in taken:
        cache.take(str(i))
    live = [tokens for i, tokens in enumerate(kept) if str(i) in cache]
    best = max((common_prefix_len(tuple(t), tuple(prompt)) // BLOCK for t in live), default=0)
    found, blocks = cache.longest(block_hashes(prompt, BLOCK), prompt)
    assert blocks == best and (found is None) == (best == 0)
    if found is not None:
        assert found.token_ids[:blocks * BLOCK] == tuple(prompt[:blocks * BLOCK])


def test_shared_prefixes_count_requests_and_stay_bounded():
    shared = SharedPrefixes(max_keys=4)
    a, b = block_hashes(range(12), BLOCK), block_hashes(list(range(8)) + [50, 51, 52, 53], BLOCK)
    shared.observe(a)
    assert shared.shared_depth(a) == 0
    shared.observe(b)
    assert shared.shared_depth(a) == 2 and shared.shared_depth(b) == 2
    shared.observe(block_hashes(range(100, 116), BLOCK))   # four new keys push the old ones out
    assert len(shared) == 4 and shared.shared_depth(a) == 0


def test_leases_pin_once_per_request_and_release_idempotently():
    cache = SessionCache(BLOCK)
    kept = entry("prefix:0", range(8))
    cache.put(kept)
    prefixes = DecodePrefixes(cache, BLOCK)
    prompt = tuple(range(10))
    assert prefixes.hold("r", prompt, "") == 8 and kept.pins == 1
    assert prefixes.hold("r", prompt, "") == 8 and kept.pins == 1   # a second hold replaces the first
    assert prefixes.lease("r").num_tokens == 8 and prefixes.lease("r").entry is kept
    prefixes.release("r")
    prefixes.release("r")
    assert kept.pins == 0 and prefixes.lease("r") is None
    assert prefixes.hold("s", prompt, "other-tenant") == 0


def test_depth_to_keep_skips_what_is_kept_already():
    cache = SessionCache(BLOCK)
    prefixes = DecodePrefixes(cache, BLOCK)
    keys = prefixes.keys(tuple(range(13)), "")
    assert len(keys) == 3   # (13 - 1) // 4: the last prompt token is never reused
    prefixes.observe(keys)
    assert prefixes.depth_to_keep(keys) == 0
    prefixes.observe(keys)
    assert prefixes.depth_to_keep(keys) == 3
    cache.put(entry("prefix:0", range(12)))
    assert prefixes.depth_to_keep(keys) == 0


def test_common_prefix_len():
    assert common_prefix_len((1, 2, 3), [1, 2, 4]) == 2
    assert common_prefix_len((1, 2), (1, 2, 3)) == 2
    assert common_prefix_len((), (1,)) == 0
