"""Prefix-aware prefill routing, simulated: how often a prompt's opening is already cached on the
node it is sent to, and how even the load stays, against least-loaded placement.

Contract: `simulate(num_nodes, num_requests, prefix_aware, ...) -> PrefixRun` drives `ClusterPolicy`
(the broker's own policy) through `SimCluster` with a workload of shared openings: `num_prefixes`
distinct system prompts (one per tenant and template), chosen with Zipf-like weights (the k-th most
used 1/k as often), each request the opening followed by its own question. Every node keeps an LRU
of the `cache_per_node` openings it prefilled last (its prefix cache, in openings rather than
bytes); a request is a hit when its node holds its opening. Load: each request adds its tokens;
every node reports `queued_tokens` after each round of as many requests as nodes, having worked off
`drain_tokens` (a steady cluster just below saturation). Returns the hit rate, the max/mean of the
tokens placed per node, and the routing state the policy holds per prefill node. Deterministic
(a seeded generator, no clock). `python -m scheduler.prefix_simulation` prints the table
(`make bench-scheduler` runs it after the decode figures).
"""

from __future__ import annotations

import random
import statistics
import sys
from collections import OrderedDict
from dataclasses import dataclass

from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.prefill_keys import prefill_key
from scheduler.simulation import SimCluster

OPENING_TOKENS = 512
QUESTION_TOKENS = 40


@dataclass(frozen=True, slots=True)
class PrefixRun:
    hit_rate: float
    max_over_mean: float      # tokens placed per node, the busiest against the mean
    ring_bytes_per_node: int  # the policy's routing state for one prefill node (its ring points)


def simulate(num_nodes: int, num_requests: int, prefix_aware: bool, *, num_prefixes: int = 5_000,
             cache_per_node: int = 8, drain_tokens: int = 600, seed: int = 0) -> PrefixRun:
    rng = random.Random(seed)
    policy = ClusterPolicy(SchedulerSettings())
    cluster = SimCluster(policy)
    for i in range(num_nodes):
        cluster.join(f"prefill-{i}", "prefill", queued_tokens=0)
    caches: dict[str, OrderedDict[int, None]] = {node_id: OrderedDict() for node_id in cluster.nodes}
    queued = dict.fromkeys(cluster.nodes, 0)
    placed = dict.fromkeys(cluster.nodes, 0)
    weights = [1 / (k + 1) for k in range(num_prefixes)]
    openings = rng.choices(range(num_prefixes), weights=weights, k=num_requests)
    hits = 0
    for i, opening in enumerate(openings):
        tokens = OPENING_TOKENS + QUESTION_TOKENS
        prompt = [opening] * OPENING_TOKENS + [rng.randrange(50_000) for _ in range(QUESTION_TOKENS)]
        key = prefill_key(prompt) if prefix_aware else str(tokens)
        node_id = cluster.request("prefill", key).node_id
        cache = caches[node_id]
        hits += opening in cache
        cache[opening] = None
        cache.move_to_end(opening)
        if len(cache) > cache_per_node:
            cache.popitem(last=False)
        queued[node_id] += tokens
        placed[node_id] += tokens
        if (i + 1) % num_nodes == 0:   # a round: every node works off its share and reports
            for nid in cluster.nodes:
                queued[nid] = max(0, queued[nid] - drain_tokens)
                cluster.report(nid, queued_tokens=queued[nid])
    ring_bytes = len(policy.prefill_ring._points) * 2 * sys.getsizeof(0) // max(num_nodes, 1)
    return PrefixRun(hits / num_requests, max(placed.values()) / statistics.mean(placed.values()), ring_bytes)


def main() -> None:
    print("prefill routing: prefix-cache hit rate and balance (Zipf openings of 512 tokens, 8 cached per node)")
    for num_nodes, num_requests in ((16, 20_000), (1_000, 20_000)):
        for prefix_aware in (False, True):
            run = simulate(num_nodes, num_requests, prefix_aware)
            label = "prefix-aware" if prefix_aware else "least-loaded"
            print(f"  {num_nodes:5d} nodes, {num_requests} requests, {label:12s}: hit rate {run.hit_rate:.3f}, "
                  f"max/mean tokens {run.max_over_mean:.3f}, routing state {run.ring_bytes_per_node} B/node")


if __name__ == "__main__":
    main()
