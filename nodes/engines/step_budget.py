"""How many prompt tokens the next engine step may prefill so that a step with streams in it ends
within a time target (Sarathi-Serve's token budget, sized from measured costs). Plain data: no torch.

Contract: `StepBudget(target_s, cap_tokens)`; `next_step(num_decoding)` is the next step's prompt
token budget (None: unbounded; 0: a decode-only step, below), `tokens(num_decoding)` its size, `pace(num_decoding)` how many times longer a prompt then takes than alone (a step's
time over its prompt tokens' share; 1.0 while a cost is unknown), `observe(elapsed_s,
num_decode_tokens, num_prefill_tokens)` feeds back what a step cost. With no stream decoding, or
no target (0), or before both costs are measured, the budget is `cap_tokens` (0: unbounded). Else
it is what the target leaves after the decode tokens' measured time, at the measured time per
prompt token, never above the cap, and never below what takes as long as the decode tokens do
(`MIN_PREFILL_SHARE` of the step): a stream's token then waits about the target for a step,
however many prompts the node prefills, or twice its decode-only step when that alone nears the
target; a prompt this node took on still moves at half speed or better (pace <= 2), where a
fixed floor let lent prompts crawl for seconds behind a growing batch (make bench-lend, 12-06).
Costs are exponential moving averages: a decode-only step's time and a prompt token's time in a
step that also decodes (the step's time less the decode part). While prompts are pending every
step mixes both, so with a target every `REFRESH_STEPS`-th mixed step runs decode-only: a decode
time left stale while the batch grew would be charged to the prompt tokens, shrinking the budget
step after step (prompts crawling again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SMOOTHING = 0.2           # weight of the newest measurement in each moving average...
DECODE_SMOOTHING = 0.5    # ...but a decode-only step's: rare while prompts are pending, each counts more
MIN_PREFILL_SHARE = 0.5   # of a step's time, the prompt tokens get at least this much
REFRESH_STEPS = 8         # mixed steps between two decode-only ones (what keeps `decode_s` current)


@dataclass(slots=True)
class StepBudget:
    target_s: float                  # a step with streams should end within this (0: no target)
    cap_tokens: int                  # prompt tokens a step prefills at most (0: unbounded)
    min_tokens: int = 16             # ...and at least (before MIN_PREFILL_SHARE), when it has prompts
    decode_s: float | None = None    # a decode-only step's time, smoothed
    prefill_token_s: float | None = None   # one prompt token's time beside decode tokens, smoothed
    num_mixed_steps: int = 0         # steps with both kinds of token since the last decode-only one

    def next_step(self, num_decoding: int) -> int | None:
        if self.target_s > 0 and num_decoding and self.num_mixed_steps >= REFRESH_STEPS:
            return 0
        return self.tokens(num_decoding) or None

    def tokens(self, num_decoding: int) -> int:
        if num_decoding == 0 or self.target_s <= 0 or self.decode_s is None or self.prefill_token_s is None:
            return self.cap_tokens
        room = self.target_s - self.decode_s
        if room > 0 and self.prefill_token_s <= 0:   # prompt tokens measured as free: only the cap bounds them
            return self.cap_tokens
        fits = int(room / self.prefill_token_s + 1e-6) if room > 0 else 0   # 1e-6: 0.02 / 0.001 is 19.99...
        share = MIN_PREFILL_SHARE / (1 - MIN_PREFILL_SHARE) * self.decode_s
        floor = math.ceil(share / self.prefill_token_s - 1e-6) if self.prefill_token_s > 0 else 0
        budget = max(self.min_tokens, fits, floor)
        return min(budget, self.cap_tokens) if self.cap_tokens else budget

    def pace(self, num_decoding: int) -> float:
        tokens = self.tokens(num_decoding)
        if num_decoding == 0 or not tokens or not self.decode_s or not self.prefill_token_s:
            return 1.0
        return 1.0 + self.decode_s / (tokens * self.prefill_token_s)

    def observe(self, elapsed_s: float, num_decode_tokens: int, num_prefill_tokens: int) -> None:
        if elapsed_s < 0 or (num_decode_tokens == 0 and num_prefill_tokens == 0):
            return
        if num_prefill_tokens == 0:
            self.decode_s = _smoothed(self.decode_s, elapsed_s, DECODE_SMOOTHING)
            self.num_mixed_steps = 0
            return
        self.num_mixed_steps += 1 if num_decode_tokens else 0
        decode_part = (self.decode_s or 0.0) if num_decode_tokens else 0.0
        self.prefill_token_s = _smoothed(self.prefill_token_s, max(0.0, elapsed_s - decode_part) / num_prefill_tokens)


def _smoothed(average: float | None, value: float, weight: float = SMOOTHING) -> float:
    return value if average is None else average + weight * (value - average)
