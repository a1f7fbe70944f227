"""The `prefill` routing key: a prompt's length, and a name for its shared prefix.

Contract: `prefill_key(prompt_token_ids, salt)` is what a client sends as the routing key of a
`prefill` request: `"<num_tokens>"`, or `"<num_tokens>.<prefix>"` when the prompt has at least one
full block of `BLOCK_TOKENS` tokens. `prefix` (32 hex digits) hashes the salt and the prompt's
leading `prefix_tokens(n)` tokens: the largest power-of-two number of full blocks, at most
`MAX_PREFIX_BLOCKS` of them. `parse_prefill_key(key)` reads it back as `(num_tokens | None, prefix |
None)`, None for what is malformed (a key is peer input: any string of at most 128 bytes).

Why a power of two: prompts that share a long opening (a system prompt, a document, tool
descriptions) and end in short, different questions must get the same key, so the key covers at
least half of the prompt's full blocks and never its last partial block; prompts whose shared part
is short get different keys and spread by load, which costs them little. The salt (the gateway's
tenant) keeps one tenant's prompts off another's cache node, as the cache itself does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

BLOCK_TOKENS = 16
MAX_PREFIX_BLOCKS = 64          # 1,024 tokens: longer shared openings are as one
PREFIX_HEX = 32
MAX_KEY_DIGITS = 9              # a prompt length; longer "numbers" are peer noise


def prefix_tokens(num_tokens: int) -> int:
    blocks = min(num_tokens // BLOCK_TOKENS, MAX_PREFIX_BLOCKS)
    return 0 if blocks == 0 else BLOCK_TOKENS * (1 << (blocks.bit_length() - 1))


def prefill_key(prompt_token_ids: Sequence[int], salt: str = "") -> str:
    length = len(prompt_token_ids)
    size = prefix_tokens(length)
    if size == 0:
        return str(length)
    digest = hashlib.blake2b(salt.encode(), digest_size=PREFIX_HEX // 2, person=b"pdbus-route")
    digest.update(b"".join(int(t).to_bytes(4, "little", signed=False) for t in prompt_token_ids[:size]))
    return f"{length}.{digest.hexdigest()}"


def parse_prefill_key(key: str) -> tuple[int | None, str | None]:
    head, _, prefix = key.partition(".")
    tokens = int(head) if head.isascii() and head.isdecimal() and len(head) <= MAX_KEY_DIGITS else None
    valid = len(prefix) == PREFIX_HEX and all(c in "0123456789abcdef" for c in prefix)
    return tokens, prefix if valid else None
