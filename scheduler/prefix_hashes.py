"""Prefix hashes shared by the prefill node's cache, the client's routing key and the broker.

Contract (plain hashlib, no torch):
- `block_hashes(token_ids, block_size, salt, known=()) -> list[bytes]`: one 16-byte key per FULL block
  (`known`: the leading keys, already computed, extended rather than hashed again); key i
  hashes the salt and every token of blocks 0..i (a chain: a key names a whole prefix, never a
  block out of context). The salt (the gateway's tenant) starts every chain, so one tenant's keys
  never equal another's. The prefill node's prefix cache keys its blocks with it.
  `chain_start(salt)` and `next_key(chain, block)` are its steps (to extend a growing prompt's keys).
- `route_hash(key) -> str`: the first `ROUTE_HEX` (12) hex digits of a chained key, the name a
  prefix has in routing keys and in node reports (48 bits: a collision only costs a cache miss).
- `ROUTE_DEPTHS`: the depths, in blocks of `BLOCK_TOKENS` (16) tokens, that get a route hash:
  1, 2, 4, ... 64 (1,024 tokens). `route_hashes(token_ids, salt)` gives those of a prompt's full
  blocks, shallowest first, computed with the cache's own chain, so a node's cache keys and a
  request's key agree (when the node's `[engine] block_size` is 16, the default);
  `route_hashes_of(keys)` gives the same from keys already computed.
- Node reports: a prefill node adds `"px.<route hash>": tokens` (the depth it holds under that
  hash) to its CAPACITY, at most `MAX_REPORTED_PREFIXES` names, most recently used first.
  `PrefixHoldings` is the node-side bookkeeping (which power-of-two-depth keys a cache holds, in
  recency order); `reported_hashes(capacity)` is the broker-side reading of peer input: only
  names `px.` + 12 lowercase hex with a positive whole value count, the first
  `MAX_REPORTED_PREFIXES` of them in the map's order.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence

KEY_BYTES = 16
BLOCK_TOKENS = 16                      # the routing block size (the engine's default block size)
MAX_ROUTE_BLOCKS = 64                  # 1,024 tokens: longer shared openings route as one
ROUTE_DEPTHS = tuple(1 << i for i in range(MAX_ROUTE_BLOCKS.bit_length()))   # 1, 2, 4, ... 64
ROUTE_HEX = 12
REPORT_PREFIX = "px."
MAX_REPORTED_PREFIXES = 24             # of the 64 capacity names a node may send (bus/wire_checks.py)
_HEX = frozenset("0123456789abcdef")


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str = "",
                 known: Sequence[bytes] = ()) -> list[bytes]:
    """`known`: keys of the leading blocks computed before (of a prefix of `token_ids`, same salt):
    they are kept, not hashed again, and the chain goes on from the last of them."""
    keys = list(known[:len(token_ids) // block_size])
    chain = keys[-1] if keys else chain_start(salt)
    for start in range(len(keys) * block_size, len(token_ids) - block_size + 1, block_size):
        chain = next_key(chain, token_ids[start:start + block_size])
        keys.append(chain)
    return keys


def chain_start(salt: str) -> bytes:
    return hashlib.blake2b(salt.encode(), digest_size=KEY_BYTES, person=b"pdbus-prefix").digest()


def next_key(chain: bytes, block: Sequence[int]) -> bytes:
    """The key of `block` after the prefix whose key is `chain` (`chain_start(salt)` for block 0)."""
    data = b"".join(int(t).to_bytes(4, "little") for t in block)
    return hashlib.blake2b(chain + data, digest_size=KEY_BYTES).digest()


def route_hash(key: bytes) -> str:
    return key[:ROUTE_HEX // 2].hex()


def route_hashes(token_ids: Sequence[int], salt: str = "") -> list[str]:
    """The route hashes of a prompt at each depth of `ROUTE_DEPTHS` that its full blocks reach."""
    return route_hashes_of(block_hashes(token_ids[:MAX_ROUTE_BLOCKS * BLOCK_TOKENS], BLOCK_TOKENS, salt))


def route_hashes_of(keys: Sequence[bytes]) -> list[str]:
    """The same from a prompt's chained keys of `BLOCK_TOKENS`-token blocks (computed already)."""
    return [route_hash(keys[depth - 1]) for depth in ROUTE_DEPTHS if depth <= len(keys)]


def is_route_hash(text: str) -> bool:
    return len(text) == ROUTE_HEX and all(c in _HEX for c in text)


def reported_hashes(capacity: Mapping[str, float]) -> list[str]:
    """The prefix hashes a node's capacity report names, bounded (see the module docstring)."""
    found: list[str] = []
    for name, value in capacity.items():
        if len(found) == MAX_REPORTED_PREFIXES:
            break
        if name.startswith(REPORT_PREFIX) and is_route_hash(name[len(REPORT_PREFIX):]) and _is_depth(value):
            found.append(name[len(REPORT_PREFIX):])
    return found


def _is_depth(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value > 0 and float(value).is_integer()


class PrefixHoldings:
    """The power-of-two-depth keys a prefix cache holds, most recently used last.

    The cache calls `note(keys, num_held)` when a prompt's first `num_held` chained keys were
    matched or stored (only the keys at `ROUTE_DEPTHS` are tracked: at most 7 a call) and
    `forget(key)` when it evicts a block; `top(limit)` reads the `limit` most recent as report
    names in O(limit), never scanning the cache."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._depths: OrderedDict[bytes, int] = OrderedDict()   # key -> its depth in tokens

    def __len__(self) -> int:
        return len(self._depths)

    def note(self, keys: Sequence[bytes], num_held: int) -> None:
        # Deepest first, so a prefix's head ends the most recent, as in the cache's own order.
        num_held = min(num_held, len(keys))
        for depth in reversed(ROUTE_DEPTHS):
            if depth <= num_held:
                self._depths[keys[depth - 1]] = depth * self.block_size
                self._depths.move_to_end(keys[depth - 1])

    def forget(self, key: bytes) -> None:
        self._depths.pop(key, None)

    def top(self, limit: int) -> dict[str, int]:
        recent = itertools.islice(reversed(self._depths.items()), max(limit, 0))
        return {REPORT_PREFIX + route_hash(key): tokens for key, tokens in recent}
