"""Prefill-side prefix cache: the KV of full prompt blocks, found again by a chained hash.

Contract: `block_hashes(token_ids, block_size, salt)` (scheduler/prefix_hashes.py, re-exported here)
gives one 16-byte key per FULL block of the prompt; key i is a hash of the salt and of every token
of blocks 0..i (a chain: a key names a whole prefix, never a block out of context).
`PrefixCache(block_size, max_bytes)` keeps KV blocks `[layers, 2, kv_heads, block_size, head_dim]`
by key, least recently used first out, within `max_bytes` (0: nothing is kept):
- `match(keys, num_prompt_tokens) -> list[Tensor]`: the cached blocks of the longest run of leading
  keys, at most `(num_prompt_tokens - 1) // block_size` of them (the last prompt token is always
  computed: its logits give the first token). Hits become the most recently used.
- `store(keys, kv)`: copy each full block of a prompt's KV `[layers, 2, kv_heads, tokens, head_dim]`
  not cached yet, evicting the least recently used blocks to fit.
- `num_blocks` and `num_bytes`: what it holds (the engine's stats count the hits).
- `holdings(limit) -> {"px.<route hash>": tokens}`: what the prefill node reports in its CAPACITY
  (scheduler/prefix_hashes.py): the `limit` most recently used keys at power-of-two depths
  (1, 2, 4, ... 64 blocks) it holds, each with the tokens it covers; O(limit), never a scan. Empty
  when `block_size` is not the routing block size (16): such keys never match a routing key.
Blocks are copies: a request's export tensor is never shared with the cache, so a transfer, an
eviction or a later request can never change another's KV.

Tenants: the salt (the gateway's per-API-key tag) starts the chain, so two tenants' identical
prompts have unrelated keys and one cannot learn from timings what another has sent. Eviction
order: a hit touches its blocks last-to-first, so a prefix's first block is its most recent and
eviction takes the tails of prefixes before their heads (a head evicted would strand its tail).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

# The chain lives with the routing key's code, so a node's cache keys and a request's key agree.
from scheduler.prefix_hashes import BLOCK_TOKENS, KEY_BYTES, PrefixHoldings, block_hashes

__all__ = ["KEY_BYTES", "PrefixCache", "block_hashes", "seed_kv"]


class PrefixCache:
    def __init__(self, block_size: int, max_bytes: int) -> None:
        if block_size < 1 or max_bytes < 0:
            raise ValueError(f"prefix cache: block_size {block_size} and max_bytes {max_bytes} must be >= 1 and >= 0")
        self.block_size, self.max_bytes = block_size, max_bytes
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._holdings = PrefixHoldings(block_size)
        self.num_bytes = 0

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def match(self, keys: Sequence[bytes], num_prompt_tokens: int) -> list[torch.Tensor]:
        usable = min(len(keys), (num_prompt_tokens - 1) // self.block_size)
        hits: list[torch.Tensor] = []
        for key in keys[:usable]:
            block = self._blocks.get(key)
            if block is None:
                break
            hits.append(block)
        for key in reversed(keys[:len(hits)]):   # the head most recent: tails go first
            self._blocks.move_to_end(key)
        self._holdings.note(keys, len(hits))
        return hits

    def holdings(self, limit: int) -> dict[str, int]:
        return self._holdings.top(limit) if self.block_size == BLOCK_TOKENS else {}

    def store(self, keys: Sequence[bytes], kv: torch.Tensor) -> None:
        if self.max_bytes == 0:
            return
        for i in reversed(range(len(keys))):   # stored tail first: the head ends most recent
            key = keys[i]
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            block = kv[:, :, :, i * self.block_size:(i + 1) * self.block_size].to("cpu", copy=True).contiguous()
            size = block.numel() * block.element_size()
            if size > self.max_bytes:   # every block is this size: none fits
                break
            self._evict_to(self.max_bytes - size)
            self._blocks[key] = block
            self.num_bytes += size
        # A budget smaller than the prompt evicts its own tail while its head goes in.
        self._holdings.note(keys, self._num_leading_held(keys))

    def _num_leading_held(self, keys: Sequence[bytes]) -> int:
        return next((i for i, key in enumerate(keys) if key not in self._blocks), len(keys))

    def _evict_to(self, limit: int) -> None:
        while self.num_bytes > limit and self._blocks:
            key, block = self._blocks.popitem(last=False)
            self._holdings.forget(key)
            self.num_bytes -= block.numel() * block.element_size()


def seed_kv(kv: torch.Tensor, blocks: Sequence[torch.Tensor]) -> int:
    """Copy cached blocks into the head of a prompt's KV tensor; the tokens they cover."""
    start = 0
    for block in blocks:
        size = block.shape[3]
        kv[:, :, :, start:start + size].copy_(block)
        start += size
    return start
