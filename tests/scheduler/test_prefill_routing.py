"""Prefix-aware prefill routing, as plain data: the key a client sends (length and the hashes of
the prompt's prefixes of 1, 2, 4, ... blocks), its parsing of any peer string, the index of what
nodes report they cache (`px.` capacity names), and the policy's placement (the node reporting the
longest match under the load bound, else the deepest hash's home on the ring while under the bound,
the next clockwise, then the least loaded)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.prefill_keys import (
    BLOCK_TOKENS,
    MAX_KEY_BYTES,
    PrefillKey,
    parse_prefill_key,
    prefill_key,
    prefix_tokens,
)
from scheduler.prefix_hashes import MAX_REPORTED_PREFIXES, block_hashes, route_hash, route_hashes
from scheduler.simulation import SimCluster

SYSTEM = list(range(100, 100 + 300))   # 18 full blocks and 12 tokens
H = "0123456789ab"                     # a well-formed route hash


def test_the_key_names_the_prefixes_at_each_power_of_two_depth_of_full_blocks():
    assert [prefix_tokens(n) for n in (0, 15, 16, 47, 48, 64, 300, 5000)] == [0, 0, 16, 32, 32, 64, 256, 1024]
    assert prefill_key(list(range(10))) == "10"          # no full block: the length alone
    keys = block_hashes(SYSTEM, BLOCK_TOKENS, "t")     # the prefix cache's own chain
    assert prefill_key(SYSTEM, "t") == ".".join(["300", *(route_hash(keys[d - 1]) for d in (1, 2, 4, 8, 16))])
    assert parse_prefill_key(prefill_key(SYSTEM, "t")) == PrefillKey(300, tuple(route_hashes(SYSTEM, "t")))


def test_the_longest_key_fits_the_bus_bound():
    key = prefill_key(range(999_999_999), "tenant")   # 9 digits, 7 depths (a range: nothing listed)
    assert len(key.encode()) <= MAX_KEY_BYTES and len(key.encode()) == 9 + 7 * 13
    assert parse_prefill_key(key) == PrefillKey(999_999_999, tuple(key.split(".")[1:]))


def test_prompts_sharing_a_long_opening_share_a_deepest_hash_and_tenants_do_not():
    questions = ([1, 2, 3], [7] * 20, [9] * 40)
    deepest = {parse_prefill_key(prefill_key(SYSTEM + q)).hashes[-1] for q in questions}
    assert len(deepest) == 1                           # 256 tokens of the system prompt, whatever follows
    a, b = parse_prefill_key(prefill_key(SYSTEM, "tenant-a")), parse_prefill_key(prefill_key(SYSTEM, "t-b"))
    assert not set(a.hashes) & set(b.hashes)
    assert parse_prefill_key(prefill_key([5] + SYSTEM)).hashes[-1] not in deepest


def test_malformed_parts_end_the_hashes_and_a_bad_length_is_none():
    cases = {
        "": (None, ()), "40": (40, ()), "x": (None, ()), "-4": (None, ()), "1234567890": (None, ()),
        "٣": (None, ()), f"40.{H}": (40, (H,)), f"40.{H}.{H.upper()}.{H}": (40, (H,)),
        f"40.{H[:-1]}.{H}": (40, ()), f"40..{H}": (40, ()), f"x.{H}.{H}": (None, (H, H)),
        f"40.{H}." : (40, (H,)), "40." + ".".join([H] * 8): (40, (H,) * 6),   # at most 7; the 7th holds a dot
        "40." + ".".join([H] * 7): (40, (H,) * 7), f"40.{H}0": (40, ()), "40." + "0" * 32: (40, ()),
    }
    for key, expected in cases.items():
        assert parse_prefill_key(key) == expected, key


@given(st.text(max_size=200))
def test_any_peer_key_parses_to_a_length_and_well_formed_hashes(key):
    tokens, hashes = parse_prefill_key(key)
    assert tokens is None or 0 <= tokens < 10**9
    assert len(hashes) <= 7 and all(len(h) == 12 and int(h, 16) >= 0 and h == h.lower() for h in hashes)
    assert ".".join(hashes) in key


def _cluster(num_nodes: int, **settings) -> SimCluster:
    cluster = SimCluster(ClusterPolicy(SchedulerSettings(**settings)))
    for i in range(num_nodes):
        cluster.join(f"prefill-{i}", "prefill", queued_tokens=0)
    return cluster


def test_a_prefix_goes_to_its_home_node_every_time_under_the_bound():
    cluster = _cluster(4)
    key = prefill_key(SYSTEM)
    placed = set()
    for _ in range(6):
        placed.add(cluster.request("prefill", key).node_id)
        cluster.report(next(iter(placed)), queued_tokens=0)   # the node keeps up
    assert len(placed) == 1 and cluster.policy.metrics["prefill.prefix_home"] == 6


def test_many_prefixes_spread_over_the_nodes():
    cluster = _cluster(4)
    homes = Counter(cluster.request("prefill", prefill_key([s] * 64 + SYSTEM)).node_id for s in range(200))
    for node_id in list(cluster.nodes):
        cluster.report(node_id, queued_tokens=0)
    assert set(homes) == set(cluster.nodes) and max(homes.values()) < 2.5 * 200 / 4


def test_a_busy_home_passes_the_prefix_to_the_next_node_and_then_to_the_least_loaded():
    cluster = _cluster(3, prefill_affinity_slack_tokens=500)
    key = prefill_key(SYSTEM)
    home = cluster.request("prefill", key).node_id
    cluster.report(home, queued_tokens=5000)               # far above the idlest plus the slack
    second = cluster.request("prefill", key).node_id
    assert second != home and cluster.policy.metrics["prefill.prefix_next"] == 1
    for node_id in cluster.nodes:
        cluster.report(node_id, queued_tokens=5000 if node_id in (home, second) else 0)
    third = cluster.request("prefill", key).node_id
    assert third not in (home, second)


def test_a_departed_home_hands_its_prefixes_to_the_next_node_only():
    cluster = _cluster(4)
    keys = [prefill_key([s] * 64) for s in range(100)]
    before = {key: cluster.request("prefill", key).node_id for key in keys}
    for node_id in list(cluster.nodes):
        cluster.report(node_id, queued_tokens=0)
    gone = Counter(before.values()).most_common(1)[0][0]
    cluster.leave(gone)
    after = {key: cluster.request("prefill", key).node_id for key in keys}
    moved = [key for key in keys if before[key] != after[key]]
    assert moved and all(before[key] == gone for key in moved)   # nothing else moved


def test_keys_without_a_prefix_keep_least_loaded_placement():
    cluster = _cluster(2)
    cluster.report("prefill-0", queued_tokens=900)
    assert cluster.request("prefill", "40").node_id == "prefill-1"
    assert cluster.policy.metrics["prefill.least_loaded"] == 1
    assert BLOCK_TOKENS == 16




# -- node reports: the longest reported match wins under the bound -----------------------------

def _report(cluster: SimCluster, node_id: str, prompt: list[int], depths: int, queued: int = 0, salt: str = "",
            **extra: float) -> None:
    """`node_id` reports it holds the first `depths` route hashes of `prompt` (as px. names)."""
    held = {f"px.{h}": 16 << i for i, h in enumerate(route_hashes(prompt, salt)[:depths])}
    cluster.report(node_id, queued_tokens=queued, **held, **extra)


def _home(cluster: SimCluster, prompt: list[int]) -> str:
    return cluster.policy.prefill_ring.lookup(parse_prefill_key(prefill_key(prompt)).hashes[-1])


def test_the_node_reporting_the_deepest_match_wins_over_the_ring_home():
    cluster = _cluster(4)
    home = _home(cluster, SYSTEM)
    others = [n for n in cluster.nodes if n != home]
    _report(cluster, others[0], SYSTEM, 3)    # 4 blocks
    _report(cluster, others[1], SYSTEM, 5)    # 16 blocks: the deepest of SYSTEM's 5 hashes
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == others[1]
    assert cluster.policy.metrics["prefill.prefix_reported"] == 1
    _report(cluster, others[1], SYSTEM, 5)    # its report resets what was routed there
    grown = SYSTEM + list(range(5000, 5300))  # a later turn: 36 blocks, a new deepest hash (32)
    assert cluster.request("prefill", prefill_key(grown)).node_id == others[1]


def test_equal_matches_go_to_fewer_outstanding_tokens_then_the_usual_ties():
    cluster = _cluster(3)
    for node_id, queued in (("prefill-0", 900), ("prefill-1", 300), ("prefill-2", 300)):
        _report(cluster, node_id, SYSTEM, 2, queued=queued)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == "prefill-1"   # then by node id
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == "prefill-2"   # 1 now has more routed


def test_a_holder_over_the_load_bound_is_passed_over_for_a_shallower_one_then_the_ring():
    cluster = _cluster(4, prefill_affinity_slack_tokens=500)
    home = _home(cluster, SYSTEM)
    deep, shallow = [n for n in cluster.nodes if n != home][:2]
    _report(cluster, deep, SYSTEM, 5, queued=5000)      # far above the idlest plus the slack
    _report(cluster, shallow, SYSTEM, 1)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == shallow
    _report(cluster, shallow, SYSTEM, 1, queued=5000)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == home              # the cheap default
    assert cluster.policy.metrics["prefill.prefix_home"] == 1


def test_without_reports_the_deepest_hash_goes_home_and_a_stale_report_is_replaced():
    cluster = _cluster(4)
    home = _home(cluster, SYSTEM)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == home
    other = next(n for n in cluster.nodes if n != home)
    _report(cluster, other, SYSTEM, 5)
    _report(cluster, other, [1] * 64, 3)                 # it evicted SYSTEM: the new report says so
    _report(cluster, home, [], 0)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == home
    assert cluster.policy.metrics["prefill.prefix_reported"] == 0


def test_a_departed_node_leaves_the_index_and_a_joining_one_is_indexed_from_ready():
    cluster = _cluster(3)
    home = _home(cluster, SYSTEM)
    other = next(n for n in cluster.nodes if n != home)
    _report(cluster, other, SYSTEM, 5)
    cluster.leave(other)
    assert cluster.policy.prefixes.by_node.keys() <= set(cluster.nodes) and not cluster.policy.prefixes.holders_of
    held = {f"px.{h}": 16 for h in route_hashes(SYSTEM)}
    cluster.join("prefill-new", "prefill", queued_tokens=0, **held)
    assert cluster.request("prefill", prefill_key(SYSTEM)).node_id == "prefill-new"


def test_a_tenants_report_never_attracts_another_tenants_prompt():
    cluster = _cluster(4)
    home = _home(cluster, SYSTEM)
    other = next(n for n in cluster.nodes if n != home)
    _report(cluster, other, SYSTEM, 5, salt="tenant-a")
    cluster.request("prefill", prefill_key(SYSTEM, "tenant-b"))
    assert cluster.policy.metrics["prefill.prefix_reported"] == 0
    assert cluster.request("prefill", prefill_key(SYSTEM, "tenant-a")).node_id == other


def test_malformed_names_decode_nodes_and_names_past_24_are_not_indexed():
    cluster = _cluster(2)
    cluster.join("decode-0", "decode", **{f"px.{H}": 16})
    bad = {f"px.{H.upper()}": 16, f"px.{H}0": 16, f"px.{H[:-1]}": 16, "px.": 16, f"p.{H}": 16,
           "px.0123456789ac": 0, "px.0123456789ad": -32, "px.0123456789ae": 2.5}
    cluster.report("prefill-0", queued_tokens=0, **bad)
    many = {f"px.{i:012x}": 16 for i in range(60)}
    cluster.report("prefill-1", queued_tokens=0, **many)
    index = cluster.policy.prefixes
    assert "prefill-0" not in index.by_node and "decode-0" not in index.by_node
    assert index.by_node["prefill-1"] == {f"{i:012x}" for i in range(MAX_REPORTED_PREFIXES)}
    cluster.request("prefill", f"40.{59:012x}")                       # the 60th name: not indexed
    assert cluster.policy.metrics["prefill.prefix_reported"] == 0
    cluster.request("prefill", f"40.{23:012x}")                       # the 24th: indexed
    assert cluster.policy.metrics["prefill.prefix_reported"] == 1


@given(st.lists(st.dictionaries(st.text(max_size=20).map(lambda t: "px." + t) | st.from_regex(
    r"px\.[0-9a-f]{12}", fullmatch=True), st.integers(-5, 5000) | st.floats(allow_nan=True), max_size=64),
    min_size=1, max_size=6))
def test_any_reports_keep_the_index_bounded_and_consistent(reports):
    cluster = _cluster(3)
    for i, report in enumerate(reports):
        cluster.report(f"prefill-{i % 3}", queued_tokens=0, **report)
        cluster.request("prefill", f"100.{next(iter(report), 'x.')[3:]}")
    index = cluster.policy.prefixes
    assert all(len(hashes) <= MAX_REPORTED_PREFIXES for hashes in index.by_node.values())
    pairs = {(h, n) for n, hashes in index.by_node.items() for h in hashes}
    assert pairs == {(h, n) for h, nodes in index.holders_of.items() for n in nodes} and all(index.holders_of.values())


def test_the_simulation_caches_more_with_reports_than_with_the_ring_alone():
    from scheduler.prefix_simulation import simulate
    spread, ring, reports = (simulate(40, 2_000, mode, num_prefixes=200) for mode in ("least-loaded", "ring",
                                                                                        "ring+reports"))
    assert reports.hit_rate > ring.hit_rate + 0.05 and ring.hit_rate > 2 * spread.hit_rate
    assert reports.hit_rate <= reports.ceiling and reports.reported_share > 0
    assert 0 < reports.index_bytes_per_node < 16_384 and reports.max_over_mean < 2.5
    assert spread.index_bytes_per_node < 100                     # nothing reported, nothing indexed
