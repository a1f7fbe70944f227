"""The decode side's KV storage: one tensor of per-request slots, in one store that only grows,
with the cached sessions' KV in the store's tail.

Contract: `SlotCache` holds `[layers, slots, 2, kv_heads, capacity, head_dim]`. Running requests
occupy slots 0..n-1 (the engine keeps them dense by moving the last one into a freed slot), so one
batched attention call covers every decode token with no gathering. `layout_after(slots, tokens)`
says, without allocating, what shape the cache would grow to (the engine charges that padded size
against the KV budget at admission, so growth never runs out of memory); `ensure` gives it that
shape, keeping what the running slots hold. The tensor is a view of the start of a flat store: a
layout that fits the store takes it in place (a growing one moves its rows within the store, no
allocation), a larger one allocates a new store (copying). `reserve(tokens)` allocates and faults
in a store of that many token rows now. `keep(owner, slot, tokens)` copies a finished request's
KV to the store's tail and points `owner.payload` at it (session_tail.py; a tensor of its own
where the tail has no room), `forget(owner)` frees that room; a layout growing into the tail
first packs the sessions against the end (their payloads follow). `idle()` says nothing runs
any more: `num_slots` / `capacity` read 0 and the next `ensure` lays a fresh layout over the
store, its old contents no longer mattering. `release` frees the store. `num_bytes` is what the
store takes. `write` (from a token offset), `read` and `move` copy KV in the export layout
[layers, 2, kv_heads, tokens, head_dim].

Why a store faulted in ahead: a new cache is faulted in on huge pages (hugepages.py), which the
kernel may have to compact first, milliseconds a page. Allocated on demand, a fresh decode node's
first request, and every request that grows the cache, would wait for that inside `add_request`,
stalling every running stream as long (`make bench-kv-memory` measures it). Grown in place within a reserved
store it is a copy of the rows (tests/nodes/engines/test_kv_slots.py asserts no allocation).
Stale contents are harmless: every element ever written is a finite KV value or zero, and
masked-out keys only ever meet 0 weights (0 * finite = 0; a NaN would not vanish, hence zeros, not
`empty`, at allocation).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bus.kv.pieces import RawPieces
from nodes.engines import hugepages
from nodes.engines.kv_landing import copy_pieces
from nodes.engines.model_config import LlamaConfig
from nodes.engines.session_tail import SessionTail

SLOT_GROWTH = 8          # grow by this many slots: few reallocations, little padding
CAPACITY_GROWTH = 256    # and capacity by this many tokens


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def relayout(store: torch.Tensor, old: tuple[int, ...], new: tuple[int, ...], num_live: int | None = None) -> None:
    """Move a `[layers, slots, 2, heads, capacity, dim]` layout's contents at the start of `store`
    into the larger layout `new` of the same store, in place: each row's first `num_live` tokens
    (default: all of it; the rest of a row holds nothing anyone reads). Layers go last to first:
    with no dimension shrinking, a layer's destination starts at or after its source, so it only
    ever overwrites layers already moved; a destination overlapping its own source goes via a copy."""
    num_layers, num_slots = old[0], old[1]
    num_tokens = old[4] if num_live is None else min(num_live, old[4])
    old_layer, new_layer = math.prod(old[1:]), math.prod(new[1:])
    source = store[:num_layers * old_layer].view(old)
    target = store[:num_layers * new_layer].view(new)
    for layer in reversed(range(num_layers)):
        src, dst = source[layer, :, :, :, :num_tokens], target[layer, :num_slots, :, :, :num_tokens]
        if dst.data_ptr() == src.data_ptr() and dst.stride() == src.stride():
            continue
        dst.copy_(src if layer * new_layer >= (layer + 1) * old_layer else src.clone())


class SlotCache:
    def __init__(self, config: LlamaConfig, *, dtype: torch.dtype, device: torch.device,
                 max_slots: int, max_len: int, budget_tokens: int) -> None:
        self._config = config
        self._dtype = dtype
        self._device = device
        self.max_slots = max_slots
        self.max_len = max_len
        self.budget_tokens = budget_tokens
        self.tensor: torch.Tensor | None = None
        self._store: torch.Tensor | None = None
        self.sessions = SessionTail()   # cached sessions' KV in the store's tail
        self._idle = False

    @property
    def num_slots(self) -> int:
        running = self._running()
        return 0 if running is None else running.shape[1]

    @property
    def capacity(self) -> int:
        running = self._running()
        return 0 if running is None else running.shape[4]

    def _running(self) -> torch.Tensor | None:
        """The layout the running requests' slots are in (None: nothing runs)."""
        return None if self.tensor is None or self._idle else self.tensor

    @property
    def num_bytes(self) -> int:
        return 0 if self._store is None else self._store.numel() * self._element_size()

    def num_bytes_for(self, num_tokens: int) -> int:
        """What a store of `num_tokens` token rows takes."""
        return num_tokens * self._token_elements() * self._element_size()

    @property
    def num_store_tokens(self) -> int:
        """Token rows the store holds without allocating (0 without one)."""
        return 0 if self._store is None else self._store.numel() // self._token_elements()

    def layout_after(self, num_slots: int, num_tokens: int, budget_tokens: int | None = None) -> tuple[int, int]:
        """The (slots, capacity) `ensure(num_slots, num_tokens, budget_tokens)` would leave: at least
        what is asked, plus spare room (fewer reallocations) only where it stays within the budget."""
        budget = self.budget_tokens if budget_tokens is None else budget_tokens
        slots = max(self.num_slots, num_slots)
        capacity = max(self.capacity, num_tokens)
        capacity = max(capacity, min(_round_up(num_tokens, CAPACITY_GROWTH), self.max_len,
                                     budget // slots))
        return max(slots, min(_round_up(num_slots, SLOT_GROWTH), self.max_slots, budget // capacity)), capacity

    def ensure(self, num_slots: int, num_tokens: int, budget_tokens: int | None = None,
               num_live_tokens: int | None = None) -> None:
        """Lay out room for `num_slots` requests of up to `num_tokens` tokens; what the running slots
        hold is kept, their first `num_live_tokens` tokens (default: whole rows) when it moves."""
        slots, capacity = self.layout_after(num_slots, num_tokens, budget_tokens)
        live = self._running()
        running = None if live is None else tuple(live.shape)
        c = self._config
        shape = (c.num_layers, slots, 2, c.num_kv_heads, capacity, c.head_dim)
        if running == shape:
            return
        need = math.prod(shape)
        store = self._store
        if store is None or store.numel() < need:
            store = self._replace_store(need, shape)
        else:
            self.sessions.make_room(store, need)
            if running is not None:
                relayout(store, running, shape, num_live_tokens)
        self.tensor = store[:need].view(shape)
        self._idle = False

    def reserve(self, num_tokens: int) -> None:
        """Allocate (and fault in) a store of `num_tokens` token rows now, unless it holds them."""
        need = num_tokens * self._token_elements()
        if self._store is None or self._store.numel() < need:
            live = self._running()
            self._replace_store(need, None if live is None else tuple(live.shape))

    def keep(self, owner: Any, slot: int, num_tokens: int) -> None:
        """Point `owner.payload` at a copy of the slot's first `num_tokens` tokens: in the store's
        tail when it has room there (session_tail.py), else a tensor of its own."""
        source = self.view(slot)[:, :, :, :num_tokens]
        live = self._running()
        front = 0 if live is None else live.numel()
        if self._store is None or not self.sessions.place(self._store, owner, source, front):
            owner.payload = source.clone()

    def forget(self, owner: Any) -> None:
        """`owner`'s KV is no longer needed: its room in the tail is free."""
        self.sessions.forget(owner)

    def _replace_store(self, num_elements: int, shape: tuple[int, ...] | None) -> torch.Tensor:
        """A new, zeroed store; what the running slots hold is copied into layout `shape` of it."""
        running = self._running()
        self.sessions.evict_all()
        if running is None:   # nothing to carry over: let the old store go before the new one faults in
            self.tensor = self._store = None
        if self._device.type == "cpu":   # huge pages: the decode attention streams it faster
            store = hugepages.empty((num_elements,), self._dtype).zero_()
        else:
            store = torch.zeros(num_elements, dtype=self._dtype, device=self._device)
        if running is not None and shape is not None:
            view = store[:math.prod(shape)].view(shape)
            view[:, :running.shape[1], :, :, :running.shape[4]] = running
            self.tensor = view
        self._store = store
        return store

    def _token_elements(self) -> int:
        c = self._config
        return c.num_layers * 2 * c.num_kv_heads * c.head_dim

    def _element_size(self) -> int:
        return torch.empty(0, dtype=self._dtype).element_size()

    def idle(self) -> None:
        self._idle = self.tensor is not None

    def release(self) -> None:
        self.sessions.evict_all()
        self.tensor, self._store, self._idle = None, None, False

    @property
    def cache(self) -> torch.Tensor:
        """The slots' tensor as `ensure` laid it out (a decode step attends over all of it)."""
        assert self.tensor is not None, "no slots laid out yet"
        return self.tensor

    def view(self, slot: int) -> torch.Tensor:
        return self.cache[:, slot]

    def write(self, slot: int, kv: torch.Tensor | RawPieces, token_offset: int = 0) -> None:
        """Write `kv` into the slot from token `token_offset` on."""
        if isinstance(kv, RawPieces):   # a raw transfer's frames, copied here once (bus/kv/pieces.py)
            copy_pieces(kv, self.view(slot), token_offset)
            return
        stop = token_offset + kv.shape[3]
        self.view(slot)[:, :, :, token_offset:stop] = kv.to(device=self._device, dtype=self._dtype)

    def read(self, slot: int, num_tokens: int) -> torch.Tensor:
        return self.view(slot)[:, :, :, :num_tokens].clone()

    def move(self, source: int, target: int, num_tokens: int) -> None:
        self.view(target)[:, :, :, :num_tokens] = self.view(source)[:, :, :, :num_tokens]
