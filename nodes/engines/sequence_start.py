"""An admitted decode request as a running `Sequence` (step_schedule.py), ready for its first step.

Contract: `start_sequence(request, num_reserved, processor, tokenizer, eos_token_ids)` builds the
sequence with its output tracker (stop strings, EOS, and `length` where the reserved context ends
before max_tokens does) and its seeded generator. A request that carries the prefill node's first
token (`first_token_id`) has it replayed: appended, pushed through the tracker and the logits
processor, and one draw taken from a random sampler's generator, so text, penalties and the seeded
random stream continue exactly where the prefill node left them.
"""

from __future__ import annotations

import torch

from nodes.engines.base import DecodeRequest
from nodes.engines.logits_process import RequestLogits
from nodes.engines.output import OutputTracker
from nodes.engines.sampling import new_generator
from nodes.engines.step_schedule import Sequence
from nodes.engines.tokenizer import Tokenizer


def start_sequence(request: DecodeRequest, num_reserved: int, processor: RequestLogits | None,
                   tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> Sequence:
    sampling = request.sampling
    max_tokens = num_reserved - len(request.prompt_token_ids)
    tracker = OutputTracker(tokenizer, sampling, eos_token_ids, max_tokens=max_tokens)
    seq = Sequence(request.request_id, list(request.prompt_token_ids), len(request.prompt_token_ids),
                   sampling, tracker, num_reserved,
                   session_id=request.session_id, generator=new_generator(sampling.seed),
                   processor=processor)
    if request.first_token_id is not None:
        seq.token_ids.append(request.first_token_id)
        seq.output.push(request.first_token_id)
        if seq.processor is not None:
            seq.processor.accept(request.first_token_id)
        if seq.generator is not None and not sampling.is_greedy:
            torch.rand(1, generator=seq.generator)
    return seq
