"""The phased workload of the elasticity benchmark (issue #42 item 6): a mix that shifts over time,
chat-heavy, then document-heavy, then chat-heavy again, on one cluster that is not restarted.

Contract (pure, seeded, no I/O):
- `PHASES`: (name, document share) of the three phases: `chat-1` 5 %, `document` 65 %, `chat-2`
  5 %. Chats and documents have the mixed workload's shapes (`serve_workload.CHAT`, `DOCUMENT`:
  128 ± 50 % tokens in, 128 out; 1536 ± 25 % in, 64 out), output lengths times `scale`.
- `phase_plan(rate, duration_s, same_rate=False) -> list[Phase]`: three phases of `duration_s`
  each, back to back. The chat phases arrive at `rate` req/s; the document phase at the rate that
  sends the same prompt tokens per second (`rate` x 198.4 / 1043.2 = 0.19 x `rate`), or at `rate`
  too with `same_rate`. Why equal prompt tokens: at one request rate the document phase carries
  5.3x the prompt tokens of a chat phase, so a rate that loads the chat phases leaves nothing
  standing in the document phase, and one the document phase survives leaves the chat phases
  idle; either way a phase ranks no system. With equal prompt tokens the 1:1 split's prefill node
  gets the same work in every phase, in few long prompts or in many short ones, while the chat
  phases bring 7x the decode work: what changes is the shape, not the volume.
- `phased_workload(plan, seed, vocab_size, scale=1.0, burstiness=1.0) -> (specs, offsets)`: per
  phase, gamma arrivals (burstiness 1 = Poisson) at its rate over its span (a random count, as a
  Poisson process gives), and of those exactly round(count x share) documents in random order.
  Each spec carries its phase's name (`RequestSpec.phase`). Phase k draws from seed
  `seed * 1000 + k`, so one seed gives the same requests at the same times for every system.
- `expected_requests(plan) -> float`: the mean request count of a plan (for progress bars).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from harness.bench.serve.serve_workload import CHAT, DOCUMENT, RequestSpec, _length, _prompt

PHASES = (("chat-1", 0.05), ("document", 0.65), ("chat-2", 0.05))


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    document_share: float
    rate: float          # req/s
    start_s: float       # from the start of the load
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def mean_prompt_tokens(document_share: float) -> float:
    """The mean prompt of a mix (each shape's length is uniform around its mean)."""
    return document_share * float(DOCUMENT["input_len"]) + (1 - document_share) * float(CHAT["input_len"])


def phase_plan(rate: float, duration_s: float, same_rate: bool = False) -> list[Phase]:
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"phased workload: rate and phase duration must be > 0, got {rate}, {duration_s}")
    chat_tokens = mean_prompt_tokens(PHASES[0][1])
    plan = []
    for index, (name, share) in enumerate(PHASES):
        phase_rate = rate if same_rate else rate * chat_tokens / mean_prompt_tokens(share)
        plan.append(Phase(name, share, phase_rate, index * duration_s, (index + 1) * duration_s))
    return plan


def expected_requests(plan: list[Phase]) -> float:
    return sum(phase.rate * phase.duration_s for phase in plan)


def _arrivals(rng: random.Random, rate: float, duration_s: float, burstiness: float) -> list[float]:
    """Send times in [0, duration_s): gamma gaps of mean 1/rate, as `serve_workload.arrival_offsets`."""
    offsets, now = [], rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    while now < duration_s:
        offsets.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


def _phase_specs(rng: random.Random, phase: Phase, num: int, vocab_size: int, scale: float) -> list[RequestSpec]:
    num_documents = round(num * phase.document_share)
    kinds = [DOCUMENT] * num_documents + [CHAT] * (num - num_documents)
    rng.shuffle(kinds)
    return [RequestSpec(str(k["kind"]), _prompt(rng, _length(rng, int(k["input_len"]), float(k["input_ratio"])),
                                                 vocab_size),
                        max(2, round(int(k["output_len"]) * scale)), phase=phase.name) for k in kinds]


def phased_workload(plan: list[Phase], seed: int, vocab_size: int, scale: float = 1.0,
                    burstiness: float = 1.0) -> tuple[list[RequestSpec], list[float]]:
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    specs: list[RequestSpec] = []
    offsets: list[float] = []
    for index, phase in enumerate(plan):
        rng = random.Random(seed * 1000 + index)
        times = _arrivals(rng, phase.rate, phase.duration_s, burstiness)
        specs += _phase_specs(rng, phase, len(times), vocab_size, scale)
        offsets += [phase.start_s + t for t in times]
    return specs, offsets
