"""Prefix-aware prefill routing, as plain data: the key a client sends (length and a hash of the
prompt's opening), its parsing of any peer string, and the policy's placement (a prefix's home
node while under the load bound, the next clockwise, then the least loaded)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.prefill_keys import BLOCK_TOKENS, parse_prefill_key, prefill_key, prefix_tokens
from scheduler.simulation import SimCluster

SYSTEM = list(range(100, 100 + 300))   # 18 full blocks and 12 tokens


def test_the_key_hashes_the_largest_power_of_two_of_full_blocks():
    assert [prefix_tokens(n) for n in (0, 15, 16, 47, 48, 64, 300, 5000)] == [0, 0, 16, 32, 32, 64, 256, 1024]
    assert prefill_key(list(range(10))) == "10"          # no full block: the length alone
    tokens, prefix = parse_prefill_key(prefill_key(SYSTEM))
    assert tokens == 300 and prefix is not None and len(prefix) == 32


def test_prompts_sharing_a_long_opening_share_a_key_and_tenants_do_not():
    questions = ([1, 2, 3], [7] * 20, [9] * 40)
    prefixes = {parse_prefill_key(prefill_key(SYSTEM + q))[1] for q in questions}
    assert len(prefixes) == 1                           # 256 tokens of the system prompt, whatever follows
    assert parse_prefill_key(prefill_key(SYSTEM, "tenant-a"))[1] != parse_prefill_key(prefill_key(SYSTEM, "t-b"))[1]
    assert parse_prefill_key(prefill_key([5] + SYSTEM))[1] not in prefixes


@given(st.text(max_size=200))
def test_any_peer_key_parses_to_a_length_and_a_prefix_or_none(key):
    tokens, prefix = parse_prefill_key(key)
    assert tokens is None or 0 <= tokens < 10**9
    assert prefix is None or (len(prefix) == 32 and int(prefix, 16) >= 0)


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


def test_the_simulation_finds_openings_cached_far_more_often_with_prefix_routing():
    from scheduler.prefix_simulation import simulate
    spread = simulate(50, 3_000, prefix_aware=False, num_prefixes=500)
    aware = simulate(50, 3_000, prefix_aware=True, num_prefixes=500)
    assert aware.hit_rate > 2 * spread.hit_rate and aware.max_over_mean < 1.6
    assert aware.ring_bytes_per_node < 16_384   # the broker's routing state per node: its ring points
