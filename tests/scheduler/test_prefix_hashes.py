"""The prefix hashes both sides share, as plain data: the chain (salted by tenant), the route
hashes at power-of-two depths, a node's holdings in recency order, and the broker's reading of
`px.` capacity names (peer input: anything malformed is ignored, and at most 24 count)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.prefix_hashes import (
    BLOCK_TOKENS,
    MAX_REPORTED_PREFIXES,
    REPORT_PREFIX,
    ROUTE_DEPTHS,
    PrefixHoldings,
    block_hashes,
    chain_start,
    is_route_hash,
    next_key,
    reported_hashes,
    route_hash,
    route_hashes,
    route_hashes_of,
)

PROMPT = list(range(1000, 1000 + 40 * BLOCK_TOKENS))   # 40 full blocks


def test_the_depths_are_the_powers_of_two_up_to_64_blocks():
    assert ROUTE_DEPTHS == (1, 2, 4, 8, 16, 32, 64) and BLOCK_TOKENS == 16


def test_the_chain_is_its_steps_and_a_key_names_the_whole_prefix():
    keys = block_hashes(PROMPT, BLOCK_TOKENS, "tenant-a")
    assert keys[0] == next_key(chain_start("tenant-a"), PROMPT[:16])
    assert keys[1] == next_key(keys[0], PROMPT[16:32])
    other = block_hashes([7] * 16 + PROMPT[16:], BLOCK_TOKENS, "tenant-a")
    assert all(a != b for a, b in zip(keys, other, strict=True))   # a changed head changes every key


def test_route_hashes_are_the_chain_keys_at_each_depth_the_full_blocks_reach():
    keys = block_hashes(PROMPT, BLOCK_TOKENS)
    hashes = route_hashes(PROMPT)
    assert hashes == [route_hash(keys[d - 1]) for d in (1, 2, 4, 8, 16, 32)]
    assert hashes == route_hashes_of(keys) and all(is_route_hash(h) for h in hashes)
    assert route_hash(keys[0]) == keys[0].hex()[:12]
    assert route_hashes(PROMPT[:15]) == [] and len(route_hashes(PROMPT[:16])) == 1
    assert len(route_hashes(list(range(5000)))) == 7                 # 64 blocks at most


def test_one_tenants_hashes_never_match_anothers():
    a, b = set(route_hashes(PROMPT, "tenant-a")), set(route_hashes(PROMPT, "tenant-b"))
    assert not a & b and not a & set(route_hashes(PROMPT))


def test_is_route_hash_takes_only_12_lowercase_hex_digits():
    assert is_route_hash("0123456789ab")
    for bad in ("", "0123456789a", "0123456789abc", "0123456789AB", "0123456789ag", "０123456789ab", "0123456789a "):
        assert not is_route_hash(bad), bad


# -- a node's holdings -------------------------------------------------------------------------

def test_holdings_track_only_power_of_two_depths_most_recent_first_and_bounded():
    holdings = PrefixHoldings(BLOCK_TOKENS)
    keys = block_hashes(PROMPT, BLOCK_TOKENS)
    holdings.note(keys, 40)
    names = list(holdings.top(10))
    assert names == [REPORT_PREFIX + route_hash(keys[d - 1]) for d in (1, 2, 4, 8, 16, 32)]   # head most recent
    assert list(holdings.top(10).values()) == [16, 32, 64, 128, 256, 512]
    assert len(holdings.top(2)) == 2 and holdings.top(0) == {} and holdings.top(-1) == {}
    holdings.note(keys, 5)            # only the first 5 held (a match of 5 blocks): depths 1, 2, 4
    assert len(holdings) == 6


def test_a_later_prefix_comes_first_and_a_forgotten_key_goes():
    holdings = PrefixHoldings(BLOCK_TOKENS)
    first, second = block_hashes(PROMPT[:64], BLOCK_TOKENS), block_hashes(PROMPT[64:128], BLOCK_TOKENS)
    holdings.note(first, 4)
    holdings.note(second, 4)
    assert list(holdings.top(3)) == [REPORT_PREFIX + route_hash(second[i]) for i in (0, 1, 3)]
    holdings.forget(second[0])
    holdings.forget(b"never held")
    assert REPORT_PREFIX + route_hash(second[0]) not in holdings.top(10) and len(holdings) == 5
    holdings.note(first, 1)           # used again: its head is the most recent
    assert next(iter(holdings.top(1))) == REPORT_PREFIX + route_hash(first[0])


def test_more_held_than_keys_given_is_clamped():
    holdings = PrefixHoldings(BLOCK_TOKENS)
    holdings.note(block_hashes(PROMPT[:48], BLOCK_TOKENS), 100)   # 3 keys: depths 1 and 2
    assert len(holdings) == 2


# -- the broker's reading of a report -----------------------------------------------------------

def test_reported_hashes_keep_only_well_formed_px_names_with_positive_whole_values():
    capacity = {"queued_tokens": 5, "px.0123456789ab": 256, "px.0123456789ac": 16.0,
                "px.0123456789AB": 16, "px.0123456789a": 16, "px.0123456789abc": 16, "py.0123456789ad": 16,
                "px.0123456789ae": 0, "px.0123456789af": -16, "px.0123456789b0": 1.5,
                "px.0123456789b1": float("inf"), "px.0123456789b2": float("nan"), "px.0123456789b3": True,
                "px.0123456789b4": "16", "0123456789b5": 16}
    assert reported_hashes(capacity) == ["0123456789ab", "0123456789ac"]


def test_at_most_24_names_count_the_first_in_the_reports_order():
    capacity = {f"px.{i:012x}": 16 for i in range(40)}
    assert reported_hashes(capacity) == [f"{i:012x}" for i in range(MAX_REPORTED_PREFIXES)]


@given(st.dictionaries(st.text(max_size=70), st.one_of(st.integers(), st.floats(), st.booleans(), st.none(),
                                                        st.text(max_size=5)), max_size=80))
def test_any_capacity_map_gives_at_most_24_well_formed_hashes(capacity):
    found = reported_hashes(capacity)
    assert len(found) <= MAX_REPORTED_PREFIXES and all(is_route_hash(h) for h in found)
    assert all(REPORT_PREFIX + h in capacity for h in found)


@given(st.dictionaries(st.from_regex(r"px\.[0-9a-f]{12}", fullmatch=True), st.integers(1, 10_000), max_size=64))
def test_well_formed_reports_are_read_in_order(capacity):
    assert reported_hashes(capacity) == [name[3:] for name in capacity][:MAX_REPORTED_PREFIXES]


def test_known_leading_keys_are_extended_not_hashed_again():
    from scheduler.prefix_hashes import block_hashes
    tokens = list(range(100))
    whole = block_hashes(tokens, 16, "t")
    assert block_hashes(tokens, 16, "t", known=whole[:3]) == whole
    assert block_hashes(tokens[:40], 16, "t", known=whole) == whole[:2]   # known beyond the tokens: cut
    poison = [b"x" * 16] * 2
    assert block_hashes(tokens, 16, "t", known=poison)[:2] == poison   # trusted as given: the caller's prompt keys
