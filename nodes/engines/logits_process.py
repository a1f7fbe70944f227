"""What happens to a request's logits before a token is sampled, and the log-probabilities reported.

Contract:
- `RequestLogits(sampling, prompt, num_output_tokens=0)` is one request's processing state, or
  `RequestLogits.for_request(...)` -> None when its sampling changes nothing (the common case costs
  nothing). The prompt's last `num_output_tokens` tokens count as output (a stream resumed after a
  failover). `accept(token_id)` after every token sampled for it; `apply(row)` changes one float32
  row of logits in place, as vLLM defines the processing, in vLLM's order:
  1. `logit_bias`: the bias is added to its token's logit;
  2. `repetition_penalty` p: each token seen in the prompt or the output has its logit divided by
     p when positive, multiplied by p otherwise;
  3. `frequency_penalty` f and `presence_penalty` r: each output token's logit less
     `f * count + r` (prompt tokens are not counted).
  4. a grammar (structured output, `sampling.grammar`): the tokens it does not allow next become
     -inf, so any sampler picks an allowed one. `for_request(..., grammars=GrammarCompiler)` builds
     the request's `GrammarState`, advanced by the prompt's output tail (a resume).
  Temperature, top-k and top-p follow in sampling.py.
- `token_logprobs(logits, rows, tokens, ks) -> list[TokenLogprobs]`: for each `rows[i]` of `logits`
  (the model's raw output: vLLM's default `raw_logprobs`), `tokens[i]`'s log-softmax value and the
  `ks[i]` likeliest tokens' (likeliest first, as torch.topk orders them);
  `sampled_logprobs(logits, params, tokens)` does it for the rows whose request asked (None elsewhere).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from nodes.engines.engine_types import SamplingParams, TokenLogprobs


class RequestLogits:
    __slots__ = ("_bias_ids", "_bias_values", "_grammar", "_prompt_ids", "counts", "sampling")

    def __init__(self, sampling: SamplingParams, prompt: Sequence[int], num_output_tokens: int = 0,
                 grammar: Any = None) -> None:
        self.sampling, self._grammar = sampling, grammar
        num_prompt = len(prompt) - num_output_tokens
        self.counts: Counter[int] = Counter(prompt[num_prompt:])
        self._prompt_ids = (torch.tensor(sorted(set(prompt[:num_prompt])), dtype=torch.long)
                            if sampling.repetition_penalty != 1.0 else None)
        self._bias_ids = torch.tensor([t for t, _ in sampling.logit_bias], dtype=torch.long)
        self._bias_values = torch.tensor([b for _, b in sampling.logit_bias], dtype=torch.float32)
        if grammar is not None:
            for token in prompt[num_prompt:]:
                grammar.accept(token)

    @classmethod
    def for_request(cls, sampling: SamplingParams, prompt: Sequence[int], num_output_tokens: int = 0,
                    grammars: Any = None) -> RequestLogits | None:
        """None when nothing changes the logits. ValueError: a grammar that does not compile."""
        if not sampling.processes_logits:
            return None
        grammar = None
        if sampling.grammar is not None:
            if grammars is None:
                raise ValueError("structured output needs the engine's grammar compiler")
            grammar = grammars.new_state(sampling.grammar)
        return cls(sampling, prompt, num_output_tokens, grammar)

    @property
    def grammar_done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow (the request ends)."""
        return self._grammar is not None and self._grammar.is_terminated()

    def accept(self, token_id: int) -> None:
        self.counts[token_id] += 1
        if self._grammar is not None:
            self._grammar.accept(token_id)

    def apply(self, row: torch.Tensor) -> None:
        s = self.sampling
        vocab = row.shape[-1]
        if s.logit_bias:
            keep = self._bias_ids < vocab   # a padded vocabulary row's id past the logits: nothing to bias
            row.index_add_(0, self._bias_ids[keep], self._bias_values[keep])
        if s.repetition_penalty != 1.0:
            self._repetition(row, s.repetition_penalty)
        if self.counts and (s.frequency_penalty or s.presence_penalty):
            ids = torch.tensor(list(self.counts), dtype=torch.long)
            counts = torch.tensor(list(self.counts.values()), dtype=torch.float32)
            row.index_add_(0, ids, -(s.frequency_penalty * counts + s.presence_penalty))
        if self._grammar is not None:
            from nodes.engines.grammar import apply_masks  # llguidance: imported only when a request uses it
            apply_masks(row.unsqueeze(0), [self._grammar])

    def _repetition(self, row: torch.Tensor, penalty: float) -> None:
        assert self._prompt_ids is not None
        ids = self._prompt_ids
        if self.counts:
            ids = torch.cat([ids, torch.tensor(list(self.counts), dtype=torch.long)]).unique()
        values = row[ids]
        row[ids] = torch.where(values > 0, values / penalty, values * penalty)


def token_logprobs(logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int],
                   ks: Sequence[int]) -> list[TokenLogprobs]:
    if not rows:
        return []
    logprobs = torch.log_softmax(logits[list(rows)].float(), dim=-1).cpu()
    chosen = logprobs.gather(1, torch.tensor(tokens, dtype=torch.long)[:, None]).squeeze(1).tolist()
    k_max = max(ks)
    top_values, top_ids = logprobs.topk(k_max, dim=-1) if k_max else (None, None)
    results = []
    for i, (logprob, k) in enumerate(zip(chosen, ks, strict=True)):
        top: tuple[tuple[int, float], ...] = ()
        if k:
            assert top_ids is not None and top_values is not None
            top = tuple(zip(top_ids[i, :k].tolist(), top_values[i, :k].tolist(), strict=True))
        results.append(TokenLogprobs(logprob, top))
    return results


def sampled_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams],
                     tokens: Sequence[int]) -> list[TokenLogprobs | None]:
    """Each row's `token_logprobs` where its request asked for logprobs, else None."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    found = dict(zip(rows, token_logprobs(logits, rows, [tokens[i] for i in rows],
                                          [params[i].logprobs or 0 for i in rows]), strict=True))
    return [found.get(i) for i in range(len(params))]
