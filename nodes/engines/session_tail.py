"""Cached sessions' KV kept in the tail of the decode engine's slot store (kv_slots.py).

Contract: `SessionTail` tracks the blocks of a flat store that sessions hold, packed down from
the store's end while the slot layout grows up from its start:
- `place(store, owner, source, front) -> bool` copies `source` (a session's KV, any layout) into
  the highest free room at or above element `front` (what the slot layout uses), compacting the
  blocks first if that makes room, and points `owner.payload` at the copy. False when it does not
  fit: the caller keeps its own copy.
- `forget(owner)`: its block is free again (a no-op for an owner it does not hold); `holds(owner)`
  says whether the store holds it.
- `make_room(store, front)`: afterwards no block lies below `front`: it compacts, then moves the
  lowest sessions out of the store into copies of their own until none does.
- `evict_all()`: every held session moves into a copy of its own (the store is being replaced).
Whenever a block moves, its owner's `payload` is pointed at the new place; nothing else may keep
a reference to a held payload across those calls.

Why: a decode engine keeps each finished session's KV for a follow-up turn, and those sessions
count against the same KV budget as the slot layout. Kept as tensors of their own they were new
memory for every finished request (faulted in on the engine thread, between two decode steps)
next to a store already reserved for the whole budget; in the store's unused tail they cost a copy
and no memory. Admission keeps layout + sessions within the budget, so compacting makes room in
all but the padded corner cases, where `make_room` falls back to copies as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class _Block:
    owner: Any           # has a `payload` attribute: the view of the store it reads
    offset: int          # first element in the store
    num_elements: int


class SessionTail:
    def __init__(self) -> None:
        self._blocks: list[_Block] = []      # by offset, highest first

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def num_elements(self) -> int:
        return sum(b.num_elements for b in self._blocks)

    def start(self, store: torch.Tensor) -> int:
        """The lowest element a session holds (the store's end when none does)."""
        return self._blocks[-1].offset if self._blocks else store.numel()

    def holds(self, owner: Any) -> bool:
        return any(b.owner is owner for b in self._blocks)

    def place(self, store: torch.Tensor, owner: Any, source: torch.Tensor, front: int) -> bool:
        num_elements = source.numel()
        if self.start(store) - num_elements < front:
            self._compact(store)
        offset = self.start(store) - num_elements
        if offset < front:
            return False
        view = store[offset:offset + num_elements].view(source.shape)
        view.copy_(source)
        owner.payload = view
        self._blocks.append(_Block(owner, offset, num_elements))   # the lowest: order kept
        return True

    def forget(self, owner: Any) -> None:
        self._blocks = [b for b in self._blocks if b.owner is not owner]

    def make_room(self, store: torch.Tensor, front: int) -> None:
        if self.start(store) >= front:
            return
        self._compact(store)
        while self._blocks and self._blocks[-1].offset < front:
            block = self._blocks.pop()
            block.owner.payload = block.owner.payload.clone()

    def evict_all(self) -> None:
        for block in self._blocks:
            block.owner.payload = block.owner.payload.clone()
        self._blocks.clear()

    def _compact(self, store: torch.Tensor) -> None:
        """Pack the blocks against the store's end, highest first: each moves up (or stays), into
        room no lower block reaches; one overlapping its own old place moves via a copy."""
        end = store.numel()
        for block in self._blocks:
            offset = end - block.num_elements
            if offset != block.offset:
                source = store[block.offset:block.offset + block.num_elements]
                target = store[offset:offset + block.num_elements]
                target.copy_(source if offset >= block.offset + block.num_elements else source.clone())
                block.owner.payload = target.view(block.owner.payload.shape)
                block.offset = offset
            end = offset
