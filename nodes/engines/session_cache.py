"""What a decode engine keeps of finished requests: sessions' KV and shared prompt prefixes, found
again by session id or by a chained hash of the prompt's blocks. Plain data: no torch.

Contract:
- `CachedSession(session_id, token_ids, payload, salt, block_keys)`: the KV (`payload`, the
  engine's tensor) of exactly `token_ids`. `session_id` names a session, or is `prefix:<n>` for
  the leading blocks of finished prompts that several requests shared (no session). `block_keys`
  are the chained keys of its full blocks (nodes/engines/prefix_cache.block_hashes) under the
  tenant's `salt`. `pins` counts requests holding it for later (its KV must then stay: it is
  never evicted, taken or dropped while pinned; see admission.py).
- `SessionCache(block_size)` keeps them least recently used first, by id, and indexes every block key:
  `longest(keys, token_ids)` is the entry holding the most leading blocks of a prompt (None, 0
  when none does), checked token by token. `put`, `get`, `take`, `touch`, `rekey`,
  `lru_order`, `entries`, `holds_key`.
- `SharedPrefixes(max_keys)` counts, per block key, the requests that had it (an LRU of at most
  `max_keys` keys): `observe(keys)` at admission, `shared_depth(keys)` the most leading blocks
  that another request also had.

Why a count before keeping a prefix: a finished request's prompt KV is copied out of its slot to
be kept (kv_slots.keep), and most prompts are never seen again; copying only what a second
request shared (TinyLFU's doorkeeper) keeps system prompts and templates without copying, or
evicting sessions for, every unique prompt.
Why the index holds every block key: keys are chained, so a hit on key i means blocks 0..i of the
same prompt are held too; the longest hit is then a binary search over the prompt's keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PREFIX_OWNER = "prefix:"   # ids of entries that are prompt prefixes, not sessions


@dataclass(slots=True, eq=False)
class CachedSession:
    session_id: str
    token_ids: tuple[int, ...]      # exactly the tokens the payload's KV covers
    payload: Any
    salt: str = ""
    block_keys: tuple[bytes, ...] = ()
    pins: int = 0


class SessionCache:
    """Finished sessions and shared prefixes, least recently used first."""

    def __init__(self, block_size: int = 16) -> None:
        self.block_size = block_size   # tokens a block key covers
        self._sessions: OrderedDict[str, CachedSession] = OrderedDict()
        self._by_key: dict[bytes, list[CachedSession]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def put(self, session: CachedSession) -> None:
        self.take(session.session_id)
        self._sessions[session.session_id] = session
        for key in session.block_keys:
            self._by_key.setdefault(key, []).append(session)

    def get(self, session_id: str) -> CachedSession | None:
        """Look a session up without taking it (does not refresh its LRU position)."""
        return self._sessions.get(session_id)

    def take(self, session_id: str) -> CachedSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._unindex(session)
        return session

    def touch(self, session_id: str) -> None:
        """A hit: the entry becomes the most recently used."""
        if session_id in self._sessions:
            self._sessions.move_to_end(session_id)

    def rekey(self, session: CachedSession, new_id: str) -> None:
        """Keep `session`'s entry under another id (its LRU place moves to the end)."""
        self.take(session.session_id)
        session.session_id = new_id
        self.put(session)

    def lru_order(self) -> list[str]:
        return list(self._sessions)

    def entries(self) -> list[CachedSession]:
        """The entries, least recently used first."""
        return list(self._sessions.values())

    def holds_key(self, key: bytes) -> bool:
        return key in self._by_key

    def longest(self, keys: Sequence[bytes], token_ids: Sequence[int]) -> tuple[CachedSession | None, int]:
        """The entry holding the most of the prompt's leading blocks (`keys` are the prompt's, at
        most as many as may be reused), and how many blocks."""
        low, high = 0, len(keys)   # keys[:low] are held; keys[high:] are not
        while low < high:
            middle = (low + high + 1) // 2
            if keys[middle - 1] in self._by_key:
                low = middle
            else:
                high = middle - 1
        while low:
            for entry in self._by_key.get(keys[low - 1], ()):
                size = low * self.block_size
                if tuple(entry.token_ids[:size]) == tuple(token_ids[:size]):
                    return entry, low
            low -= 1   # a hash collision (never seen): try a shorter prefix
        return None, 0

    def _unindex(self, session: CachedSession) -> None:
        for key in session.block_keys:
            holders = self._by_key.get(key)
            if holders is None:
                continue
            holders[:] = [s for s in holders if s is not session]
            if not holders:
                del self._by_key[key]


class SharedPrefixes:
    """How many admitted requests had each block key (bounded; least recently seen out first)."""

    def __init__(self, max_keys: int = 65_536) -> None:
        self.max_keys = max_keys
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def observe(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._counts[key] = self._counts.pop(key, 0) + 1
        while len(self._counts) > self.max_keys:
            self._counts.popitem(last=False)

    def shared_depth(self, keys: Sequence[bytes]) -> int:
        """The most leading blocks whose last key at least two requests had (0: none)."""
        for depth in range(len(keys), 0, -1):
            if self._counts.get(keys[depth - 1], 0) >= 2:
                return depth
        return 0


def common_prefix_len(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
