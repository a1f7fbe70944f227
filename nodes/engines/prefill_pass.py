"""Prefill side: run a batch of prompts, return each one's first token and KV export.

Contract: `run_prefill(runner, tokenizer, requests, max_batch_tokens=..., ...) -> list[PrefillResult]`
in request order. Prompts are packed into forward passes of at most `max_batch_tokens` tokens (a
longer prompt runs alone); each prompt writes its KV straight into its own exact-size export
tensor [layers, 2, kv_heads, prompt_tokens, head_dim], so exporting costs no copy (on a GPU, one copy
out to the CPU, `exported_kv`). Only each prompt's last position gets logits, except for a prompt
whose sampling asks `prompt_logprobs`: every position of it does, its prefix cache is not read
(cached KV has no logits), and its result carries each prompt token's log-probabilities. The first
token is sampled under the request's processing (penalties, bias, grammar: logits_process.py).

`ChunkedPrefill` is the same batch as an interruptible pass (`Engine.start_prefill`): each `step()`
is one forward pass over the batch's next `chunk_tokens` prompt tokens (`plan_chunk`: the rest of the
current prompt, then the start of the next ones, in order), each span writing at its offset in its
prompt's export tensor, so a prompt cut between steps continues from its KV and nothing is computed
twice. The step that computes a prompt's last token samples its first token. In float32 the results
equal `run_prefill`'s: same token ids, KV bit-identical on this CPU (tests/nodes/engines/test_prefill_chunks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nodes.engines.base import PrefillPass, PrefillRequest, PrefillResult, TokenLogprobs
from nodes.engines.forward_batch import ForwardBatch, PrefillSpan
from nodes.engines.kv_export import DeviceExport, exported_kv
from nodes.engines.llama import LlamaRunner
from nodes.engines.logits_process import RequestLogits, sampled_logprobs, token_logprobs
from nodes.engines.output import OutputTracker
from nodes.engines.prefix_cache import PrefixCache, block_hashes, seed_kv
from nodes.engines.sampling import new_generator, sample

Grammars = Callable[[], Any] | None   # the engine's GrammarCompiler, built when a prompt first needs it


def run_prefill(runner: LlamaRunner, tokenizer, requests: Sequence[PrefillRequest], *,
                max_batch_tokens: int, max_model_len: int, eos_token_ids: tuple[int, ...],
                cache: PrefixCache | None = None, grammars: Grammars = None) -> list[PrefillResult]:
    for request in requests:
        _validate(request, max_model_len, runner.config.vocab_size)
    results: list[PrefillResult] = []
    for group in _pack(requests, max_batch_tokens):
        results.extend(_prefill_group(runner, tokenizer, [_Prompt.start(r, cache) for r in group], eos_token_ids,
                                      cache, grammars))
    return results


def _validate(request: PrefillRequest, max_model_len: int, vocab_size: int) -> None:
    num_tokens = len(request.prompt_token_ids)
    if num_tokens == 0:
        raise ValueError(f"request {request.request_id}: empty prompt")
    if num_tokens >= max_model_len:
        raise ValueError(f"request {request.request_id}: prompt of {num_tokens} tokens leaves no room "
                         f"in the model's context of {max_model_len}")
    if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= vocab_size:
        raise ValueError(f"request {request.request_id}: token id outside the vocabulary (0..{vocab_size - 1})")


def _pack(requests: Sequence[PrefillRequest], max_batch_tokens: int) -> list[list[PrefillRequest]]:
    groups: list[list[PrefillRequest]] = []
    num_tokens = max_batch_tokens
    for request in requests:
        size = len(request.prompt_token_ids)
        if num_tokens + size > max_batch_tokens:
            groups.append([])
            num_tokens = 0
        groups[-1].append(request)
        num_tokens += size
    return groups


def _prefill_group(runner: LlamaRunner, tokenizer, group: list[_Prompt], eos_token_ids: tuple[int, ...],
                   cache: PrefixCache | None, grammars: Grammars) -> list[PrefillResult]:
    """One forward pass over each prompt's tokens past its cached prefix."""
    logits = _forward(runner, [(prompt, prompt.num_computed, prompt.num_tokens - prompt.num_computed)
                               for prompt in group])
    return _first_tokens(tokenizer, group, logits, eos_token_ids, cache, grammars)


def _forward(runner: LlamaRunner, plan: list[tuple[_Prompt, int, int]]) -> torch.Tensor:
    """One forward pass over the spans `(prompt, start, num_tokens)`; returns the logits of the
    last position of each prompt the pass completes, in plan order. A prompt that asks for prompt
    logprobs gets logits at every position of its span too, and keeps their log-probabilities."""
    spans: list[PrefillSpan] = []
    rows: list[int] = []
    finished_rows: list[int] = []
    wanted: list[tuple[_Prompt, int, int]] = []   # (prompt, first logits row, span start)
    token_ids: list[int] = []
    positions: list[int] = []
    for prompt, start, num_tokens in plan:
        spans.append(PrefillSpan(row=len(token_ids), num_tokens=num_tokens, start=start,
                                 kv=prompt.allocate(runner), export=prompt.export))
        if prompt.request.sampling.prompt_logprobs is not None:
            wanted.append((prompt, len(rows), start))
            rows.extend(range(len(token_ids), len(token_ids) + num_tokens))
        token_ids.extend(prompt.request.prompt_token_ids[start:start + num_tokens])
        positions.extend(range(start, start + num_tokens))
        prompt.num_computed = start + num_tokens
        if prompt.num_computed == prompt.num_tokens:
            if prompt.request.sampling.prompt_logprobs is None:
                rows.append(len(token_ids) - 1)
            finished_rows.append(len(rows) - 1)
    device = runner.device
    logits = runner.forward(ForwardBatch(
        token_ids=torch.tensor(token_ids, device=device), positions=torch.tensor(positions, device=device),
        sample_rows=torch.tensor(rows, dtype=torch.long, device=device), spans=spans)).cpu()
    for prompt, first_row, start in wanted:
        prompt.keep_prompt_logprobs(logits, first_row, start)
    return logits[finished_rows]


def _first_tokens(tokenizer, prompts: list[_Prompt], logits: torch.Tensor, eos_token_ids: tuple[int, ...],
                  cache: PrefixCache | None, grammars: Grammars = None) -> list[PrefillResult]:
    """Sample each finished prompt's first token (logits row i is prompts[i]'s last position), and
    keep its full blocks in the prefix cache."""
    params = [p.request.sampling for p in prompts]
    processors = [RequestLogits.for_request(p.request.sampling, p.request.prompt_token_ids,
                                            p.request.num_output_tokens,
                                            grammars() if grammars and p.request.sampling.grammar else None)
                  for p in prompts]
    firsts = sample(logits, params, [new_generator(p.seed) for p in params], processors)
    logprobs = sampled_logprobs(logits, params, firsts)
    results = []
    for prompt, first, first_lp in zip(prompts, firsts, logprobs, strict=True):
        if cache is not None:
            cache.store(prompt.keys, prompt.kv)
        tracker = OutputTracker(tokenizer, prompt.request.sampling, eos_token_ids)
        text, finish_reason = tracker.push(first)
        kv = prompt.export if prompt.export is not None else exported_kv(prompt.kv)
        results.append(PrefillResult(prompt.request.request_id, first, text, kv,
                                     prompt.num_tokens, finish_reason, num_cached_tokens=prompt.num_cached,
                                     logprobs=first_lp, prompt_logprobs=tuple(prompt.prompt_logprobs)))
    return results


def plan_chunk(prompts: Sequence[tuple[int, int]], chunk_tokens: int) -> list[tuple[int, int, int]]:
    """The spans of the next step: `(prompt index, start, num_tokens)` covering the next
    `chunk_tokens` uncomputed tokens, prompts in order. `prompts` holds `(num_tokens, num_computed)`."""
    spans, budget = [], chunk_tokens
    for index, (num_tokens, num_computed) in enumerate(prompts):
        if budget <= 0:
            break
        size = min(num_tokens - num_computed, budget)
        if size > 0:
            spans.append((index, num_computed, size))
            budget -= size
    return spans


@dataclass(slots=True, eq=False)
class _Prompt:
    request: PrefillRequest
    kv: Any = None           # its export tensor, allocated by the step that starts it
    export: DeviceExport | None = None   # its KV encoded on the device as layers finish (kv_export.py)
    num_computed: int = 0    # tokens whose KV is computed (or will come from the cached blocks)
    keys: list[bytes] = field(default_factory=list)          # its full blocks' prefix-cache keys
    hits: list[torch.Tensor] = field(default_factory=list)   # cached blocks of its leading keys
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)

    @classmethod
    def start(cls, request: PrefillRequest, cache: PrefixCache | None) -> _Prompt:
        """The prompt with its cached prefix found (held by reference until `allocate` copies it).
        A prompt asking for prompt logprobs computes every position (cached KV has no logits)."""
        if cache is None or cache.max_bytes == 0:
            return cls(request)
        keys = block_hashes(request.prompt_token_ids, cache.block_size, request.cache_salt)
        if request.sampling.prompt_logprobs is not None:
            return cls(request, keys=keys)
        hits = cache.match(keys, len(request.prompt_token_ids))
        return cls(request, num_computed=len(hits) * cache.block_size, keys=keys, hits=hits)

    def keep_prompt_logprobs(self, logits: torch.Tensor, first_row: int, start: int) -> None:
        """The log-probabilities of prompt tokens start+1.. from the logits of positions start..,
        rows first_row.. of `logits` (a span's last position predicts the next span's first token)."""
        if start == 0:
            self.prompt_logprobs.append(None)   # nothing predicts the first prompt token
        ids = self.request.prompt_token_ids
        end = min(self.num_computed, len(ids) - 1)   # the last position predicts the output, not the prompt
        if end > start:
            k = self.request.sampling.prompt_logprobs or 0
            rows = list(range(first_row, first_row + end - start))
            self.prompt_logprobs.extend(token_logprobs(logits, rows, ids[start + 1:end + 1], [k] * len(rows)))

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_cached(self) -> int:
        return sum(block.shape[3] for block in self.hits)

    def allocate(self, runner: LlamaRunner) -> Any:
        """Its export tensor, the cached prefix copied in (once)."""
        if self.kv is None:
            self.kv = runner.new_kv(self.num_tokens)
            seed_kv(self.kv, self.hits)
            if runner.new_export is not None:   # a cached prefix is encoded with the rest of each layer
                self.export = runner.new_export(self.request.request_id, self.kv)
        return self.kv


class ChunkedPrefill(PrefillPass):
    """A batch of prompts prefilled in steps of at most `chunk_tokens` tokens (module docstring)."""

    def __init__(self, runner: LlamaRunner, tokenizer, requests: Sequence[PrefillRequest], *, chunk_tokens: int,
                 max_model_len: int, eos_token_ids: tuple[int, ...], stats: Any = None,
                 cache: PrefixCache | None = None, grammars: Grammars = None) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        for request in requests:
            _validate(request, max_model_len, runner.config.vocab_size)
        self.runner, self.tokenizer, self.chunk_tokens = runner, tokenizer, chunk_tokens
        self.eos_token_ids, self.stats, self.cache, self.grammars = eos_token_ids, stats, cache, grammars
        self._prompts = [_Prompt.start(r, cache) for r in requests]
        self.num_steps = 0

    @property
    def done(self) -> bool:
        return not self._prompts

    @property
    def num_remaining_tokens(self) -> int:
        return sum(p.num_tokens - p.num_computed for p in self._prompts)

    def cancel(self, request_id: str) -> bool:
        before = len(self._prompts)
        self._prompts = [p for p in self._prompts if p.request.request_id != request_id]
        return len(self._prompts) < before

    def step(self) -> list[PrefillResult]:
        plan = plan_chunk([(p.num_tokens, p.num_computed) for p in self._prompts], self.chunk_tokens)
        if not plan:
            return []
        prompts = [(self._prompts[index], start, num_tokens) for index, start, num_tokens in plan]
        logits = _forward(self.runner, prompts)
        finished = [p for p, _, _ in prompts if p.num_computed == p.num_tokens]
        self.num_steps += 1
        if self.stats is not None:
            self.stats.num_prefilled_tokens += sum(num_tokens for _, _, num_tokens in prompts)
            self.stats.num_prefix_cached_tokens += sum(p.num_cached for p in finished)
        self._prompts = [p for p in self._prompts if p.num_computed < p.num_tokens]
        return _first_tokens(self.tokenizer, finished, logits, self.eos_token_ids, self.cache, self.grammars)
