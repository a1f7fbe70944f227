"""Prefix-aware prefill routing, simulated: how much of each prompt is already cached on the node it
is sent to, how even the load stays, and what the broker's index of node reports costs.

Contract: `simulate(num_nodes, num_requests, mode, ...) -> PrefixRun` drives `ClusterPolicy` (the
broker's own policy) through `SimCluster`, in one of `MODES`:
- `least-loaded`: keys carry the length only (no prefix routing);
- `ring`: keys carry the prefix hashes, nodes report nothing: the consistent-hash ring alone;
- `ring+reports`: as `ring`, and every node adds its cache's `holdings(MAX_REPORTED_PREFIXES)`
  (`px.` names, scheduler.prefix_hashes) to each report, as the real prefill node does.

Workload (chat, deterministic from `seed`): `2 x num_nodes` users chat at once; each request is
one user's next turn. A conversation opens with one of `num_prefixes` system prompts (tool
descriptions, a tenant's instructions; 128..768 tokens, Zipf-weighted: the k-th most used 1/k as
often; salted by one of 64 tenants) and runs 1..6 turns; each turn appends the previous reply and
a new message (40..300 tokens), so a prompt extends the user's previous one. The ring alone does
badly here, for two common reasons: the deepest hash (half the prompt's blocks or more) often
reaches past a short system prompt into the user's own text, so conversations that share a system
prompt get unrelated ring homes; and a conversation's deepest hash changes when it grows past a
power of two blocks, moving it off the node that holds its history. Reports let the broker find
the node holding the longest prefix either way.

Nodes: each keeps an LRU of `cache_blocks` 16-token blocks kept as `PrefixCache` keeps them (the
chained keys, tail first out, the same `PrefixHoldings` for its reports). Hit rate: the prompt
tokens served from the node's cache over all prompt tokens (what the nodes' `prefix_cached_tokens`
counts); `ceiling`, that of one cache that never forgets. Load: a node's queue grows by the tokens
it computes (the prompt less its cached part); after each round of `num_nodes` requests every node
works off `drain_tokens` (900: about one mean prompt, so without cache hits the cluster runs near
saturation) and reports `queued_tokens` (and, with reports, its holdings). Balance:
max/mean of the prompt tokens placed per node, and of the tokens computed per node (its work);
the longest queue at a round's end (a wait). Index: the bytes of the policy's `PrefixIndex`
(`sys.getsizeof` of its dicts, sets and strings, each object counted once) per prefill node; ring:
its points, two 64-bit ints each. `python -m scheduler.prefix_simulation` prints the table
(`make bench-scheduler` runs it after the decode figures).
"""

from __future__ import annotations

import itertools
import random
import statistics
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from scheduler.policy import ClusterPolicy, SchedulerSettings
from scheduler.prefix_hashes import (
    BLOCK_TOKENS,
    MAX_REPORTED_PREFIXES,
    PrefixHoldings,
    chain_start,
    next_key,
    route_hashes_of,
)
from scheduler.ring import RING_BYTES_PER_POINT
from scheduler.simulation import SimCluster

MODES = ("least-loaded", "ring", "ring+reports")
NUM_TENANTS = 64


@dataclass(frozen=True, slots=True)
class PrefixRun:
    hit_rate: float
    ceiling: float             # the hit rate of one cache that never forgets
    max_over_mean: float       # prompt tokens placed per node, the busiest against the mean
    work_max_over_mean: float  # tokens computed (not cached) per node, the same
    peak_queued_tokens: int    # the longest queue any node had at the end of a round, before its work
    index_bytes_per_node: int  # the policy's index of reported prefixes, per prefill node
    ring_bytes_per_node: int   # the policy's prefill ring, per node
    reported_share: float      # choices a report made (prefill.prefix_reported) over all


class SimCache:
    """A prefill node's prefix cache in blocks, not bytes: `PrefixCache`'s order and reports."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.holdings = PrefixHoldings(BLOCK_TOKENS)

    def match(self, keys: Sequence[bytes], num_tokens: int) -> int:
        usable = min(len(keys), (num_tokens - 1) // BLOCK_TOKENS)
        hits = next((i for i in range(usable) if keys[i] not in self.blocks), usable)
        for key in reversed(keys[:hits]):
            self.blocks.move_to_end(key)
        self.holdings.note(keys, hits)
        return hits

    def store(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            if len(self.blocks) >= self.max_blocks:
                self.holdings.forget(self.blocks.popitem(last=False)[0])
            self.blocks[key] = None
        self.holdings.note(keys, next((i for i, key in enumerate(keys) if key not in self.blocks), len(keys)))


@dataclass(slots=True)
class Conversation:
    salt: str
    turns_left: int
    tokens: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)   # chained keys of its full blocks

    def extend(self, new_tokens: Sequence[int]) -> None:
        self.tokens.extend(new_tokens)
        chain = self.keys[-1] if self.keys else chain_start(self.salt)
        for start in range(len(self.keys) * BLOCK_TOKENS, len(self.tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            chain = next_key(chain, self.tokens[start:start + BLOCK_TOKENS])
            self.keys.append(chain)

    def key(self) -> str:
        """`prefill_key(self.tokens, self.salt)`, from the keys already chained."""
        return ".".join([str(len(self.tokens)), *route_hashes_of(self.keys)])


def chat_turns(num_users: int, num_requests: int, num_prefixes: int, rng: random.Random) -> Iterator[Conversation]:
    """Each request's conversation, extended by its new turn (see the module docstring). Token ids
    count up: no two texts share a block by chance (and no random draw per token: this is fast)."""
    fresh = itertools.count()
    system = [list(itertools.islice(fresh, rng.randint(128, 768))) for _ in range(num_prefixes)]
    weights = [1 / (k + 1) for k in range(num_prefixes)]
    users: list[Conversation | None] = [None] * num_users
    for _ in range(num_requests):
        user = rng.randrange(num_users)
        conversation = users[user]
        if conversation is None or conversation.turns_left == 0:
            prefix = rng.choices(range(num_prefixes), weights=weights)[0]
            conversation = users[user] = Conversation(f"tenant-{prefix % NUM_TENANTS}", rng.randint(1, 6))
            conversation.extend(system[prefix])
        conversation.extend(list(itertools.islice(fresh, rng.randint(40, 300))))
        conversation.turns_left -= 1
        yield conversation


def simulate(num_nodes: int, num_requests: int, mode: str, *, num_prefixes: int = 2_000,
             cache_blocks: int = 512, drain_tokens: int = 900, seed: int = 0) -> PrefixRun:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    policy = ClusterPolicy(SchedulerSettings())
    cluster = SimCluster(policy)
    for i in range(num_nodes):
        cluster.join(f"prefill-{i}", "prefill", queued_tokens=0)
    caches = {node_id: SimCache(cache_blocks) for node_id in cluster.nodes}
    queued = dict.fromkeys(cluster.nodes, 0)
    placed = dict.fromkeys(cluster.nodes, 0)
    computed = dict.fromkeys(cluster.nodes, 0)
    seen: set[bytes] = set()
    hit_tokens = ceiling_tokens = prompt_tokens = peak = 0
    turns = chat_turns(2 * num_nodes, num_requests, num_prefixes, random.Random(seed))
    for i, conversation in enumerate(turns):
        tokens, keys = len(conversation.tokens), conversation.keys
        node_id = cluster.request("prefill", conversation.key() if mode != "least-loaded" else str(tokens)).node_id
        hits = caches[node_id].match(keys, tokens) * BLOCK_TOKENS
        caches[node_id].store(keys)
        ceiling_tokens += BLOCK_TOKENS * next((j for j in range((tokens - 1) // BLOCK_TOKENS) if keys[j] not in seen),
                                              (tokens - 1) // BLOCK_TOKENS)
        seen.update(keys)
        hit_tokens, prompt_tokens = hit_tokens + hits, prompt_tokens + tokens
        queued[node_id] += tokens - hits
        placed[node_id] += tokens
        computed[node_id] += tokens - hits
        if (i + 1) % num_nodes == 0:
            peak = max(peak, *queued.values())
            _round(cluster, caches, queued, drain_tokens, reports=mode == "ring+reports")
    return PrefixRun(hit_tokens / prompt_tokens, ceiling_tokens / prompt_tokens,
                     _max_over_mean(placed), _max_over_mean(computed), peak,
                     index_bytes(policy) // num_nodes,
                     policy.prefill_ring.num_points * RING_BYTES_PER_POINT // num_nodes,
                     policy.metrics["prefill.prefix_reported"] / num_requests)


def _max_over_mean(tokens: dict[str, int]) -> float:
    return max(tokens.values()) / statistics.mean(tokens.values())


def _round(cluster: SimCluster, caches: dict[str, SimCache], queued: dict[str, int], drain_tokens: int,
           reports: bool) -> None:
    """Every node works off its share and reports, with its holdings when `reports`."""
    for node_id, cache in caches.items():
        queued[node_id] = max(0, queued[node_id] - drain_tokens)
        held = cache.holdings.top(MAX_REPORTED_PREFIXES) if reports else {}
        cluster.report(node_id, queued_tokens=queued[node_id], **held)


def index_bytes(policy: ClusterPolicy) -> int:
    """`sys.getsizeof` over the policy's prefix index: its dicts, sets and strings, each once."""
    index, seen, total = policy.prefixes, set(), 0
    objects: list[object] = [index.by_node, index.holders_of]
    objects += [o for node_id, hashes in index.by_node.items() for o in (node_id, hashes, *hashes)]
    objects += [o for prefix_hash, nodes in index.holders_of.items() for o in (prefix_hash, nodes, *nodes)]
    for obj in objects:
        if id(obj) not in seen:
            seen.add(id(obj))
            total += sys.getsizeof(obj)
    return total


def main() -> None:
    print("prefill routing, chat workload (2,000 Zipf system prompts of 128..768 tokens, 64 tenants, 1..6 turns")
    print(f"of 40..300 tokens; a cache of 512 blocks per node; reports: top {MAX_REPORTED_PREFIXES} px. names)")
    print("  hit rate: prompt tokens from the node's cache (ceiling: one cache that never forgets); max/mean:")
    print("  tokens placed and computed per node; peak queue: tokens; by report: choices a reported match made;")
    print("  index: the broker's PrefixIndex, sys.getsizeof; ring: 64 points of 16 B")
    print(f"  {'nodes':>5} {'requests':>8}  {'mode':12}  {'hit rate':>8}  {'ceiling':>7}  {'placed':>6}  "
          f"{'work':>6}  {'peak queue':>10}  {'by report':>9}  {'index B/node':>12}  {'ring B/node':>11}")
    for num_nodes, num_requests in ((16, 6_000), (1_000, 15_000)):
        for mode in MODES:
            run = simulate(num_nodes, num_requests, mode)
            print(f"  {num_nodes:5d} {num_requests:8d}  {mode:12}  {run.hit_rate:8.3f}  {run.ceiling:7.3f}  "
                  f"{run.max_over_mean:6.3f}  {run.work_max_over_mean:6.3f}  {run.peak_queued_tokens:10d}  "
                  f"{run.reported_share:9.3f}  {run.index_bytes_per_node:12d}  {run.ring_bytes_per_node:11d}")


if __name__ == "__main__":
    main()
