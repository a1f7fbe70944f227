"""Workloads for the serving benchmark: what each request asks for and when it is sent.

Contract (pure, seeded, no I/O):
- `random_workload(num, input_len, output_len, range_ratio, vocab_size, seed)` -> list[RequestSpec]:
  vLLM's `random` dataset: lengths uniform in [len*(1-r), len*(1+r)], prompts of random token ids.
- `mixed_workload(num, seed, vocab_size, scale)` -> list[RequestSpec]: 80% chats (128 ± 50% in,
  128 out) and 20% documents (1536 ± 25% in, 64 out), in random order. `scale` multiplies the
  output lengths only (`bench-quick` halves them); prompt lengths stay, since the long document
  prefills are what stall running decodes.
- `shared_prefix_workload(num, seed, vocab_size, scale)` -> list[RequestSpec]: 90% chats that open
  with one of `NUM_SYSTEM_PROMPTS` system prompts of 1,024 tokens (the k-th used 1/k as often; the
  same prompts at every rate and seed, as a deployment's are) followed by a question of 32 ± 50%
  tokens, 64 out; 10% documents of 1,024 ± 25% unique tokens, 64 out. For prefix caches.
- `multi_turn_workload(num, seed, vocab_size, scale)` -> list[RequestSpec]: conversations of
  `TURNS` turns (num // TURNS of them), each opening with one of the shared system prompts cut to
  `CHAT_SYSTEM_LEN` tokens; turn t's prompt is turn t-1's, then an assistant reply of the output
  length (fixed tokens, not the model's: every system sees the same prompts), then a new user
  message of 96 ± 50% tokens; 64 out. Each turn names its conversation (`session_id`) and is sent
  only after the previous turn ended (`after`), as a user waits for the reply.
- `arrival_offsets(num, rate, burstiness, seed)` -> list[float]: send times (s from the start);
  gamma-distributed gaps as `vllm bench serve` draws them (burstiness 1 = Poisson); rate inf -> all 0.
Prompts are token-id lists sent as the completions `prompt`, so every system sees exactly the same
number of input tokens (no tokenizer round trip). Ids start at `FIRST_ID` to avoid special tokens.
The same seed gives the same requests for every system; each rate of a sweep uses its own seed
so no server can serve a repeated prompt from a prefix cache (but for the system prompts of
`shared_prefix_workload`, shared on purpose).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TypedDict

FIRST_ID = 20


class RequestShape(TypedDict):
    """One kind of request of a mix: its prompt length (mean, ± ratio), output length, share."""
    kind: str
    input_len: int
    input_ratio: float
    output_len: int
    share: float


CHAT: RequestShape = {"kind": "chat", "input_len": 128, "input_ratio": 0.5, "output_len": 128, "share": 0.8}
DOCUMENT: RequestShape = {"kind": "document", "input_len": 1536, "input_ratio": 0.25, "output_len": 64, "share": 0.2}


@dataclass(frozen=True, slots=True)
class RequestSpec:
    kind: str                         # "chat", "document", "random": picks the TTFT SLO
    prompt_token_ids: tuple[int, ...]
    output_len: int                   # max_tokens, with ignore_eos
    session_id: str = ""              # a conversation's turns share one (sent as `session_id`)
    after: int = -1                   # index of the request that must end before this one is sent
    phase: str = ""                   # the phased workload's phase it belongs to (`phased_workload`)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def _length(rng: random.Random, mean: int, ratio: float) -> int:
    low, high = max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))
    return rng.randint(low, high)


def _prompt(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    if vocab_size <= FIRST_ID:
        raise ValueError(f"vocab_size must exceed {FIRST_ID}, got {vocab_size}")
    return tuple(rng.randrange(FIRST_ID, vocab_size) for _ in range(length))


def random_workload(num: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int,
                    seed: int) -> list[RequestSpec]:
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    return [RequestSpec("random", _prompt(rng, _length(rng, input_len, range_ratio), vocab_size),
                        _length(rng, output_len, range_ratio)) for _ in range(num)]


def mixed_workload(num: int, seed: int, vocab_size: int, scale: float = 1.0) -> list[RequestSpec]:
    rng = random.Random(seed)
    num_documents = round(num * DOCUMENT["share"])
    kinds = [DOCUMENT] * num_documents + [CHAT] * (num - num_documents)
    rng.shuffle(kinds)
    return [RequestSpec(k["kind"], _prompt(rng, _length(rng, k["input_len"], k["input_ratio"]), vocab_size),
                        max(2, round(k["output_len"] * scale))) for k in kinds]


NUM_SYSTEM_PROMPTS = 4
SYSTEM_PROMPT_LEN = 1024
SYSTEM_PROMPT_SEED = 1_000_003   # the deployment's prompts: fixed, whatever the sweep's seed


def shared_prefix_workload(num: int, seed: int, vocab_size: int, scale: float = 1.0) -> list[RequestSpec]:
    system_rng = random.Random(SYSTEM_PROMPT_SEED)
    systems = [_prompt(system_rng, SYSTEM_PROMPT_LEN, vocab_size) for _ in range(NUM_SYSTEM_PROMPTS)]
    weights = [1 / (k + 1) for k in range(NUM_SYSTEM_PROMPTS)]
    rng = random.Random(seed)
    output_len = max(2, round(64 * scale))
    specs = []
    for _ in range(num):
        if rng.random() < 0.9:
            system = rng.choices(systems, weights=weights)[0]
            specs.append(RequestSpec("chat", system + _prompt(rng, _length(rng, 32, 0.5), vocab_size), output_len))
        else:
            specs.append(RequestSpec("document", _prompt(rng, _length(rng, SYSTEM_PROMPT_LEN, 0.25), vocab_size),
                                     output_len))
    return specs


TURNS = 4
CHAT_SYSTEM_LEN = 256


def multi_turn_workload(num: int, seed: int, vocab_size: int, scale: float = 1.0) -> list[RequestSpec]:
    system_rng = random.Random(SYSTEM_PROMPT_SEED)
    systems = [_prompt(system_rng, SYSTEM_PROMPT_LEN, vocab_size)[:CHAT_SYSTEM_LEN] for _ in range(NUM_SYSTEM_PROMPTS)]
    weights = [1 / (k + 1) for k in range(NUM_SYSTEM_PROMPTS)]
    rng = random.Random(seed)
    output_len = max(2, round(64 * scale))
    specs: list[RequestSpec] = []
    for conversation in range(max(1, num // TURNS)):
        prompt = rng.choices(systems, weights=weights)[0]
        session = f"conv-{seed}-{conversation}"
        for turn in range(TURNS):
            if turn:
                prompt += _prompt(rng, output_len, vocab_size)   # the assistant's previous reply
            prompt += _prompt(rng, _length(rng, 96, 0.5), vocab_size)
            specs.append(RequestSpec("chat", prompt, output_len, session, len(specs) - 1 if turn else -1))
    return specs


def arrival_offsets(num: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(num):
        offsets.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets
