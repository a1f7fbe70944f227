"""One engine step's chunks packed into the runner's `ForwardBatch` (llama.py).

Contract: `pack(chunks, slots, num_slots, device) -> ForwardBatch`. Decode tokens (one-token
chunks) come first, ordered by slot, then prefill spans; every row's position is its token's index
in its sequence; `sample_rows` lists, in the order of `chunks`, the last row of each chunk that
samples. Decode rows attend over the slot cache (`slots.cache`, slots 0..num_slots-1): idle slots
attend one harmless key, and `lengths` is left out when every slot attends as far as the longest.

Why decode first, by slot: the decode attention kernels read a contiguous run of slots, and with
rows 0..n-1 on slots 0..n-1 (`dense`) they need no scatter at all.
"""

from __future__ import annotations

import torch

from nodes.engines.forward_batch import DecodeGroup, ForwardBatch, PrefillSpan
from nodes.engines.kv_slots import SlotCache
from nodes.engines.step_schedule import ScheduledChunk


def pack(chunks: list[ScheduledChunk], slots: SlotCache, num_slots: int, device: torch.device) -> ForwardBatch:
    decode = sorted((c for c in chunks if c.num_tokens == 1), key=lambda c: c.seq.slot)
    ordered = decode + [c for c in chunks if c.num_tokens > 1]
    token_ids = [t for c in ordered for t in c.token_ids]
    positions = [p for c in ordered for p in range(c.start, c.start + c.num_tokens)]
    sample_rows, row = {}, 0
    spans = []
    for chunk in ordered:
        if chunk.num_tokens > 1:
            spans.append(PrefillSpan(row, chunk.num_tokens, chunk.start, slots.view(chunk.seq.slot)))
        row += chunk.num_tokens
        if chunk.samples:
            sample_rows[id(chunk)] = row - 1
    return ForwardBatch(torch.tensor(token_ids, device=device), torch.tensor(positions, device=device),
                        torch.tensor([sample_rows[id(c)] for c in chunks if c.samples], dtype=torch.long, device=device),
                        spans=spans, decode=_decode_group(decode, slots, num_slots, device))


def _decode_group(decode: list[ScheduledChunk], slots: SlotCache, num_slots: int,
                  device: torch.device) -> DecodeGroup | None:
    if not decode:
        return None
    slot_ids = [c.seq.slot for c in decode]
    lengths = torch.ones(num_slots, dtype=torch.long)   # idle slots attend one harmless key
    lengths[slot_ids] = torch.tensor([c.start + 1 for c in decode])
    max_len = int(lengths.max())
    return DecodeGroup(rows=torch.arange(len(decode), device=device), slots=torch.tensor(slot_ids, device=device),
                       positions=torch.tensor([c.start for c in decode], device=device),
                       cache=slots.cache, num_slots=num_slots,
                       lengths=lengths.to(device) if int(lengths.min()) < max_len else None, max_len=max_len,
                       dense=slot_ids == list(range(num_slots)))
