"""Which tokens of which requests go into the next forward pass. Plain data: no torch.

Contract: a `Sequence` is one admitted request: all its tokens so far (prompt + output), how many
of them already have KV (`num_computed_tokens`) and its decode slot. `schedule(...)` picks the
chunks for one step the way vLLM's chunked-prefill scheduler does: every decoding sequence gets its
one token first (so running streams never stall behind a prompt), then the remaining token budget
goes to pending prefills in arrival order, each cut to at most `prefill_chunk_tokens`, all of them
together to at most `max_prefill_tokens` when that is given (a decode node's one chunk a step: its
streams wait for one chunk, not one per prompt it prefills, and the oldest prompt finishes first).
A chunk that reaches the end of a sequence's known tokens yields logits and a sampled token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodes.engines.base import SamplingParams
from nodes.engines.output import OutputTracker


@dataclass(slots=True, eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    output: OutputTracker
    num_reserved_tokens: int               # KV room reserved at admission (prompt + max_tokens)
    session_id: str | None = None
    num_computed_tokens: int = 0
    slot: int = -1
    generator: Any = None                  # torch.Generator for seeded sampling (opaque here)
    arrival: int = field(default=0)
    cache_salt: str = ""                   # the tenant: kept KV is found again only under it
    prefix_keys: tuple[bytes, ...] = ()    # the prompt's reusable block keys (prefix_leases.py)
    processor: Any = None                  # logits_process.RequestLogits, or None (opaque here)

    @property
    def num_pending_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        return self.num_pending_tokens == 1 and len(self.token_ids) > self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    seq: Sequence
    start: int          # first position computed in this step
    num_tokens: int

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == len(self.seq.token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start:self.start + self.num_tokens]


def schedule(seqs: list[Sequence], *, max_batch_tokens: int, prefill_chunk_tokens: int,
             max_prefill_tokens: int = 0) -> list[ScheduledChunk]:
    budget = max_batch_tokens
    chunks: list[ScheduledChunk] = []
    for seq in seqs:
        if seq.is_decoding and budget > 0:
            chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, 1))
            budget -= 1
    if max_prefill_tokens > 0:
        budget = min(budget, max_prefill_tokens)
    for seq in seqs:
        if seq.is_decoding or seq.num_pending_tokens == 0:
            continue
        num_tokens = min(seq.num_pending_tokens, prefill_chunk_tokens, budget)
        if num_tokens <= 0:
            break
        chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num_tokens))
        budget -= num_tokens
    return chunks
