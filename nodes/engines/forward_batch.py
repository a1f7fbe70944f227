"""The batch one forward pass of the Llama runner computes: which tokens, against which KV caches.

Contract: a `ForwardBatch` packs every token of a step into rows (`token_ids`, `positions`), names the
rows whose logits are wanted (`sample_rows`), and says where each row's attention reads and writes:
- `PrefillSpan`: a run of one sequence's tokens against its own cache view `[layers, 2 (K, V),
  kv_heads, capacity, head_dim]`, causal within the span and full over the `start` tokens cached;
- `DecodeGroup`: one new token for each of several slots of a `[layers, slots, 2, kv_heads,
  capacity, head_dim]` slot cache, attended with a length mask (`attention_mask`).
batch_pack builds them from an engine step; llama.LlamaRunner and the kernels read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(slots=True)
class PrefillSpan:
    row: int                 # first row of the span in the packed batch
    num_tokens: int
    start: int               # tokens already in `kv` before this span
    kv: torch.Tensor         # [layers, 2, kv_heads, capacity, head_dim]
    export: Any = None       # a DeviceExport told as each layer of the span is final (kv_export.py)


@dataclass(slots=True)
class DecodeGroup:
    rows: torch.Tensor       # rows in the packed batch, one per decode token
    slots: torch.Tensor      # slot of each row
    positions: torch.Tensor  # position of each row's token (= tokens already cached)
    cache: torch.Tensor      # [layers, slots, 2, kv_heads, capacity, head_dim]
    num_slots: int           # attend over slots [0, num_slots)
    lengths: torch.Tensor | None  # [num_slots] keys each slot attends, on the cache's device; None = max_len each
    max_len: int             # longest context among the slots (keys 0..max_len-1)
    dense: bool              # rows/slots are exactly 0..num_slots-1 (no scatter needed)
    _mask: torch.Tensor | None = field(default=None, init=False, repr=False)

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        """[num_slots, 1, 1, max_len] additive (0 / -inf) from `lengths`, None to attend to all. Made
        on the first call, where it is made at all: only the SDPA path reads it (the decode kernels
        take the positions), and inside a CUDA graph's capture it becomes part of the graph. Once a
        step, not per layer: a bool mask would cost two conversions in every layer."""
        if self.lengths is None:
            return None
        if self._mask is None:
            keys = torch.arange(self.max_len, device=self.lengths.device)
            hidden = (keys[None, :] >= self.lengths[:, None])[:, None, None, :]
            self._mask = torch.zeros(hidden.shape, dtype=dtype, device=self.lengths.device).masked_fill_(
                hidden, float("-inf"))
        return self._mask


@dataclass(slots=True)
class ForwardBatch:
    token_ids: torch.Tensor      # [tokens] int64
    positions: torch.Tensor      # [tokens] int64
    sample_rows: torch.Tensor    # rows whose logits are wanted
    spans: list[PrefillSpan] = field(default_factory=list)
    decode: DecodeGroup | None = None
