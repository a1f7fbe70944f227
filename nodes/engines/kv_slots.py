"""The decode side's KV storage: one tensor of per-request slots, grown on demand.

Contract: `SlotCache` holds `[layers, slots, 2, kv_heads, capacity, head_dim]`. Running requests
occupy slots 0..n-1 (the engine keeps them dense by moving the last one into a freed slot), so one
batched attention call covers every decode token with no gathering. `layout_after(slots, tokens)`
says, without allocating, what shape the cache would grow to (the engine charges that padded size
against the KV budget at admission, so growth never runs out of memory); `ensure` grows it (copying
the contents). `idle()` says nothing runs any more: the tensor is kept, its contents no longer
matter, and `num_slots` / `capacity` read 0 as for an empty cache; the next `ensure` takes the kept
tensor as it is when it holds what is asked within the budget with no more capacity than a fresh
layout would have, else allocates the new layout without copying. `release` frees it. `num_bytes` is what the tensor takes, kept or in use.
`write`/`read`/`move` copy whole prefixes in the export layout [layers, 2, kv_heads, tokens, head_dim].

Why kept when idle: a new cache is faulted in on huge pages (hugepages.py), which this VM compacts
at ~3 ms a 2 MiB page: a request arriving at an idle decode node waited 30-310 ms in
`add_request` (8 slots x 768-1280 tokens of bf16) before its first step, every time the node had
gone idle in between; with the kept cache, 2.6-4.3 ms (ad-hoc timing of sequential 512- and
1024-token requests).
"""

from __future__ import annotations

import torch

from nodes.engines import hugepages
from nodes.engines.model_config import LlamaConfig

SLOT_GROWTH = 8          # grow by this many slots: few reallocations, little padding
CAPACITY_GROWTH = 256    # and capacity by this many tokens


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


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
        self._idle = False

    @property
    def num_slots(self) -> int:
        return 0 if self.tensor is None or self._idle else self.tensor.shape[1]

    @property
    def capacity(self) -> int:
        return 0 if self.tensor is None or self._idle else self.tensor.shape[4]

    @property
    def num_bytes(self) -> int:
        return 0 if self.tensor is None else self.tensor.numel() * self.tensor.element_size()

    def layout_after(self, num_slots: int, num_tokens: int, budget_tokens: int | None = None) -> tuple[int, int]:
        """The (slots, capacity) `ensure(num_slots, num_tokens, budget_tokens)` would leave: at least
        what is asked, plus spare room (fewer reallocations) only where it stays within the budget."""
        budget = self.budget_tokens if budget_tokens is None else budget_tokens
        slots = max(self.num_slots, num_slots)
        capacity = max(self.capacity, num_tokens)
        capacity = max(capacity, min(_round_up(num_tokens, CAPACITY_GROWTH), self.max_len,
                                     budget // slots))
        layout = max(slots, min(_round_up(num_slots, SLOT_GROWTH), self.max_slots, budget // capacity)), capacity
        return self._kept(layout, num_slots, num_tokens, budget) or layout

    def _kept(self, fresh: tuple[int, int], num_slots: int, num_tokens: int, budget: int) -> tuple[int, int] | None:
        """The idle tensor's (slots, capacity) when it holds what is asked within the budget with no
        more capacity than the `fresh` layout: capacity is a floor for the requests that join later
        (growth adds slots, never shrinks rows), so a cache kept from one long request would leave
        room for fewer short ones than a fresh cache does."""
        if not self._idle or self.tensor is None:
            return None
        slots, capacity = self.tensor.shape[1], self.tensor.shape[4]
        holds = num_slots <= slots and num_tokens <= capacity <= fresh[1]
        return (slots, capacity) if holds and slots * capacity <= budget else None

    def ensure(self, num_slots: int, num_tokens: int, budget_tokens: int | None = None) -> None:
        slots, capacity = self.layout_after(num_slots, num_tokens, budget_tokens)
        current = None if self.tensor is None else (self.tensor.shape[1], self.tensor.shape[4])
        if (slots, capacity) == current:   # an idle one's old KV: finite, never read past a row's length
            self._idle = False
            return
        if self._idle:   # nothing to carry over: let the old tensor go before the new one faults in
            self.tensor, self._idle = None, False
        c = self._config
        # Zeros, not empty: masked-out keys still enter the softmax @ V product, and 0 * NaN = NaN.
        shape = (c.num_layers, slots, 2, c.num_kv_heads, capacity, c.head_dim)
        if self._device.type == "cpu":   # huge pages: the decode attention streams it faster
            grown = hugepages.empty(shape, self._dtype).zero_()
        else:
            grown = torch.zeros(shape, dtype=self._dtype, device=self._device)
        if self.tensor is not None:
            grown[:, :self.num_slots, :, :, :self.capacity] = self.tensor
        self.tensor = grown

    def idle(self) -> None:
        self._idle = self.tensor is not None

    def release(self) -> None:
        self.tensor, self._idle = None, False

    def view(self, slot: int) -> torch.Tensor:
        assert self.tensor is not None
        return self.tensor[:, slot]

    def write(self, slot: int, kv: torch.Tensor) -> None:
        num_tokens = kv.shape[3]
        self.view(slot)[:, :, :, :num_tokens] = kv.to(device=self._device, dtype=self._dtype)

    def read(self, slot: int, num_tokens: int) -> torch.Tensor:
        return self.view(slot)[:, :, :, :num_tokens].clone()

    def move(self, source: int, target: int, num_tokens: int) -> None:
        self.view(target)[:, :, :, :num_tokens] = self.view(source)[:, :, :, :num_tokens]
