"""KV memory accounting in blocks, and the LRU cache of finished sessions. Plain data: no torch.

Contract:
- `BlockManager(num_blocks, block_size)` hands out block ids to owners (a request id or a session
  key), never-used ids first, then given-back ones in order. `allocate`/`resize` raise
  `KvBudgetExceeded` instead of over-committing; `free` is idempotent.
  `num_free_blocks + sum(blocks held) == num_blocks` always (asserted).
- `SessionCache` remembers finished sessions in least-recently-used order: the token ids their KV
  covers, an opaque payload (the engine's KV tensor) and how many blocks they hold. The engine
  evicts from its LRU end when an admission needs the space.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any


class KvBudgetExceeded(RuntimeError):
    """An allocation asked for more blocks than are free (the caller should have checked)."""


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Never-used ids are handed out first, in order, then given-back ones in the order they came
        # back: the sequence a deque of every id would give, without building one (a budget of
        # millions of blocks is a configuration, not a reason to take seconds at start).
        self._num_unused = num_blocks
        self._free: deque[int] = deque()
        self._owned: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self._num_unused + len(self._free)

    def _take(self) -> int:
        if self._num_unused:
            self._num_unused -= 1
            return self.num_blocks - self._num_unused - 1
        return self._free.popleft()

    def num_blocks_for(self, num_tokens: int) -> int:
        return num_blocks_for(num_tokens, self.block_size)

    def blocks_of(self, owner: str) -> list[int]:
        return list(self._owned.get(owner, ()))

    def num_blocks_of(self, owner: str) -> int:
        return len(self._owned.get(owner, ()))

    def owners(self) -> list[str]:
        return list(self._owned)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, owner: str, num_tokens: int) -> list[int]:
        """Give `owner` (which must hold nothing) enough blocks for `num_tokens` tokens."""
        if owner in self._owned:
            raise ValueError(f"{owner} already holds blocks")
        self._owned[owner] = []
        return self.resize(owner, num_tokens)

    def resize(self, owner: str, num_tokens: int) -> list[int]:
        """Grow or shrink `owner`'s blocks to cover `num_tokens` tokens."""
        blocks = self._owned.setdefault(owner, [])
        wanted = self.num_blocks_for(num_tokens)
        extra = wanted - len(blocks)
        if extra > self.num_free_blocks:
            if not blocks:
                del self._owned[owner]
            raise KvBudgetExceeded(f"{owner} needs {extra} more blocks, {self.num_free_blocks} free")
        for _ in range(extra):
            blocks.append(self._take())
        while len(blocks) > wanted:
            self._free.append(blocks.pop())
        self._check()
        return list(blocks)

    def free(self, owner: str) -> int:
        """Return `owner`'s blocks to the pool; 0 when it held none (idempotent)."""
        blocks = self._owned.pop(owner, [])
        self._free.extend(blocks)
        self._check()
        return len(blocks)

    def _check(self) -> None:
        assert self.num_free_blocks + sum(map(len, self._owned.values())) == self.num_blocks


@dataclass(slots=True)
class CachedSession:
    session_id: str
    token_ids: tuple[int, ...]      # exactly the tokens the payload's KV covers
    payload: Any


class SessionCache:
    """Finished sessions, least recently used first."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, CachedSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def put(self, session: CachedSession) -> None:
        self._sessions.pop(session.session_id, None)
        self._sessions[session.session_id] = session

    def get(self, session_id: str) -> CachedSession | None:
        """Look a session up without taking it (does not refresh its LRU position)."""
        return self._sessions.get(session_id)

    def take(self, session_id: str) -> CachedSession | None:
        return self._sessions.pop(session_id, None)

    def lru_order(self) -> list[str]:
        return list(self._sessions)


def common_prefix_len(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
