"""Decode-side prefix reuse: which kept KV a request may start from, held for it until its KV
arrives, and which finished prompts are worth keeping. Plain data: no torch.

Contract (`DecodePrefixes(sessions, block_size, keep_prefixes)`, one per decode engine):
- `keys(prompt, salt)`: the prompt's chained block keys (prefix_cache.block_hashes) that may be
  reused: at most `(len(prompt) - 1) // block_size` blocks, since the last prompt token is always
  computed where the request runs (its logits give the next token).
- `full_keys(token_ids, salt, known)`: the keys of every full block (what a kept session
  indexes), extending the prompt's keys `known` rather than hashing them again.
- `hold(request_id, prompt, salt) -> tokens`: the most leading prompt tokens whose KV a kept
  entry holds (a session's or a shared prefix's, same salt only), pinned for the request until
  `release(request_id)`; 0 when none. A second hold for the same request replaces the first.
- `lease(request_id)`: what `hold` pinned (None: nothing). The engine copies the prefix into the
  request's slot at admission, then releases.
- `observe(keys)` at admission and `depth_to_keep(keys)` at the end of a request without a
  session: the number of leading blocks to keep as a shared prefix (0: none), i.e. the blocks
  another request also had (session_cache.SharedPrefixes) and no entry holds yet.

Why pins rather than a copy at plan time: the prefix stays where it is (the slot store's tail,
no memory, no copy) while the rest of the KV crosses the wire; the engine's admission never
evicts a pinned entry (admission.py), so the prefix is there when the KV is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nodes.engines.prefix_cache import block_hashes
from nodes.engines.session_cache import CachedSession, SessionCache, SharedPrefixes


@dataclass(slots=True)
class Lease:
    entry: CachedSession
    num_tokens: int


class DecodePrefixes:
    def __init__(self, sessions: SessionCache, block_size: int, keep_prefixes: bool = True,
                 max_shared_keys: int = 65_536) -> None:
        self.sessions, self.block_size, self.keep_prefixes = sessions, block_size, keep_prefixes
        self.shared = SharedPrefixes(max_shared_keys)
        self._leases: dict[str, Lease] = {}

    def keys(self, prompt: Sequence[int], salt: str) -> tuple[bytes, ...]:
        usable = (len(prompt) - 1) // self.block_size
        return tuple(block_hashes(prompt[:usable * self.block_size], self.block_size, salt))

    def full_keys(self, token_ids: Sequence[int], salt: str, known: Sequence[bytes] = ()) -> tuple[bytes, ...]:
        """Keys of every full block (a finished session's computed KV: all of it may be reused),
        going on from `known`, the keys of its prompt computed at admission."""
        return tuple(block_hashes(token_ids, self.block_size, salt, known))

    def hold(self, request_id: str, prompt: Sequence[int], salt: str) -> int:
        self.release(request_id)
        entry, num_blocks = self.sessions.longest(self.keys(prompt, salt), prompt)
        if entry is None:
            return 0
        entry.pins += 1
        self.sessions.touch(entry.session_id)
        lease = self._leases[request_id] = Lease(entry, num_blocks * self.block_size)
        return lease.num_tokens

    def lease(self, request_id: str) -> Lease | None:
        return self._leases.get(request_id)

    def release(self, request_id: str) -> None:
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            lease.entry.pins -= 1

    def observe(self, keys: Sequence[bytes]) -> None:
        if self.keep_prefixes:
            self.shared.observe(keys)

    def depth_to_keep(self, keys: Sequence[bytes]) -> int:
        if not self.keep_prefixes:
            return 0
        depth = self.shared.shared_depth(keys)
        return 0 if depth == 0 or self.sessions.holds_key(keys[depth - 1]) else depth
