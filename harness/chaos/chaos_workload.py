"""The seeded workload every chaos pass replays: the same prompts (token ids), greedy, fixed length.

Contract: `build_workload(seed, num_requests, prompt_tokens, max_tokens, vocab_size)` returns
`RequestSpec`s whose prompts are seeded pseudo-random token ids (no tokenizer needed, the same on
every pass); `ignore_eos` keeps every stream exactly `max_tokens` long so streams are comparable
token by token. Nothing here does I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Prompt ids avoid the lowest ids (special and control tokens in real vocabularies).
LOWEST_PROMPT_ID = 16


@dataclass(frozen=True, slots=True)
class RequestSpec:
    index: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int

    @property
    def name(self) -> str:
        return f"r{self.index:03d}"


def build_workload(seed: int, num_requests: int, prompt_tokens: int, max_tokens: int,
                   vocab_size: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    top = min(vocab_size, 32000) - 1
    return [RequestSpec(i, tuple(rng.randint(LOWEST_PROMPT_ID, top) for _ in range(prompt_tokens)), max_tokens)
            for i in range(num_requests)]


def vocab_size_of(model: str) -> int:
    """The tiny model's vocabulary, or a safe bound for the real model (SmolLM2: 49152)."""
    return 512 if model == "tiny" else 49152
