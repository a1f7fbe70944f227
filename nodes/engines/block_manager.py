"""KV memory accounting in blocks. Plain data: no torch.

Contract: `BlockManager(num_blocks, block_size)` hands out block ids to owners (a request id or a
kept entry's key, session_cache.py), never-used ids first, then given-back ones in order.
`allocate`/`resize` raise `KvBudgetExceeded` instead of over-committing; `free` is idempotent;
`rename(old, new)` moves an owner's blocks to another name.
`num_free_blocks + sum(blocks held) == num_blocks` always (asserted).
"""

from __future__ import annotations

from collections import deque


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

    def rename(self, owner: str, new_owner: str) -> None:
        """`new_owner` (which must hold nothing) holds `owner`'s blocks from now on."""
        if new_owner in self._owned:
            raise ValueError(f"{new_owner} already holds blocks")
        self._owned[new_owner] = self._owned.pop(owner, [])

    def free(self, owner: str) -> int:
        """Return `owner`'s blocks to the pool; 0 when it held none (idempotent)."""
        blocks = self._owned.pop(owner, [])
        self._free.extend(blocks)
        self._check()
        return len(blocks)

    def _check(self) -> None:
        assert self.num_free_blocks + sum(map(len, self._owned.values())) == self.num_blocks
