"""The `prefill` routing key: a prompt's length, and the names of its leading prefixes.

Contract: `prefill_key(prompt_token_ids, salt)` is what a client sends as the routing key of a
`prefill` request: `"<num_tokens>"`, or `"<num_tokens>.<h1>.<h2>.<h4>..."` when the prompt has at
least one full block of `BLOCK_TOKENS` (16) tokens: the route hashes (12 hex digits each,
scheduler/prefix_hashes.py) of the prompt's chained block keys at each power-of-two depth its full
blocks reach, 1, 2, 4, ... `MAX_ROUTE_BLOCKS` (64) blocks, shallowest first. At most 9 digits and
7 hashes: 100 bytes, within the bus's 128-byte key. `parse_prefill_key(key)` reads any string (a
key is peer input) back as `PrefillKey(num_tokens | None, hashes)`: the length when it is at most
`MAX_KEY_DIGITS` decimal digits, else None; the leading run of well-formed hashes (at most 7), so
a malformed part and everything after it are ignored and a hash's position stays its depth.

Why hashes at several depths: the broker scores prefill nodes by the deepest of them that a node
reports holding (the longest cached prefix), so a prompt that shares only its opening with what a
node cached (one system prompt, different documents; a conversation grown past the last power of
two) still finds that node. The deepest hash is also the ring key when nothing is reported: it
covers at least half of the prompt's full blocks and never its last partial block, so prompts
that share a long opening and end in short, different questions share it. The chain is the
prefix cache's own, salted by the tenant: one tenant's hashes never match another's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from scheduler.prefix_hashes import BLOCK_TOKENS, MAX_ROUTE_BLOCKS, ROUTE_DEPTHS, is_route_hash, route_hashes

MAX_KEY_DIGITS = 9              # a prompt length; longer "numbers" are peer noise
MAX_KEY_BYTES = 128             # the bus's bound on a routing key

__all__ = ["BLOCK_TOKENS", "MAX_KEY_BYTES", "MAX_KEY_DIGITS", "PrefillKey", "parse_prefill_key", "prefill_key",
           "prefix_tokens"]


class PrefillKey(NamedTuple):
    num_tokens: int | None
    hashes: tuple[str, ...]     # route hashes at depths 1, 2, 4, ... blocks, shallowest first


def prefix_tokens(num_tokens: int) -> int:
    """The tokens the deepest route hash of a prompt of `num_tokens` covers (0: no full block)."""
    blocks = min(num_tokens // BLOCK_TOKENS, MAX_ROUTE_BLOCKS)
    return 0 if blocks == 0 else BLOCK_TOKENS * (1 << (blocks.bit_length() - 1))


def prefill_key(prompt_token_ids: Sequence[int], salt: str = "") -> str:
    return ".".join([str(len(prompt_token_ids)), *route_hashes(prompt_token_ids, salt)])


def parse_prefill_key(key: str) -> PrefillKey:
    head, *parts = key.split(".", len(ROUTE_DEPTHS))   # a last part holding more dots is malformed
    tokens = int(head) if head.isascii() and head.isdecimal() and len(head) <= MAX_KEY_DIGITS else None
    hashes: list[str] = []
    for part in parts:
        if not is_route_hash(part):
            break
        hashes.append(part)
    return PrefillKey(tokens, tuple(hashes))
