"""`VllmEngine`: vLLM behind pdbus's `Engine` contract (`pdbus prefill|decode --engine vllm`).

The node code is the same as with the built-in engine; only the engine changes. vLLM's offline
`LLMEngine` runs in the node's process with `PdbusConnector` as its KV connector:

- prefill (`kv_producer`): each prompt runs with max_tokens=1; the connector captures the prompt's
  KV from vLLM's paged cache into pdbus's layout `[layers, 2, kv_heads, tokens, head_dim]`, which
  the node ships over the pdbus data plane exactly like the built-in engine's KV.
- decode (`kv_consumer`): a request that comes with KV and the prefill node's first token is added
  as prompt + first token; the connector injects the KV for the prompt (vLLM's `num_cached_tokens`
  counts it) and vLLM computes only the first token's forward pass, then decodes with continuous
  batching. Without KV (local prefill, or a transfer that failed its checksums) vLLM prefills it.

Text, stop strings, EOS and max_tokens go through pdbus's own `OutputTracker` (vLLM returns token
ids only), so a stream reads the same whichever engine produced it; greedy token ids match plain
vLLM. vLLM's own prefix caching serves repeated prefixes (vllm_args.prefix_caching), under each
request's `cache_salt`; pdbus sessions and held prefixes are not (`hold_prefix` is 0), so a
follow-up turn's KV moves whole and vLLM loads what its cache lacks. Sampling with a seed is reproducible per engine, but a decode node does not continue the
prefill node's random stream as the built-in engine does; greedy is exact.
What it hands vLLM (sampling params, prompts) and reads back (logprobs): nodes/engines/vllm_convert.py.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from nodes.engines.base import (
    Admission,
    DecodeRequest,
    Engine,
    EngineConfig,
    KvLayout,
    KvUsage,
    PrefillRequest,
    PrefillResult,
    TokenEvent,
)
from nodes.engines.engine_common import resolve_dtype
from nodes.engines.engine_types import EngineStats
from nodes.engines.model_loader import ModelFolder
from nodes.engines.output import OutputTracker
from nodes.engines.vllm_args import (
    KV_ROLES,
    engine_args,
    max_context_tokens,
    prepare_environment,
    require_vllm,
)
from nodes.engines.vllm_convert import NO_GRAMMARS, passed_logprobs, vllm_prompt, vllm_sampling
from nodes.engines.vllm_mailbox import MAILBOX


@dataclass(slots=True)
class _Running:
    request_id: str
    kv_key: str
    tracker: OutputTracker
    num_reserved_tokens: int
    num_prompt_tokens: int
    seen_first_output: bool = False
    logprobs: int | None = None   # the request's `sampling.logprobs`


class VllmEngine(Engine):
    def __init__(self, model: ModelFolder, config: EngineConfig | None = None, *, role: str = "both") -> None:
        self.config = config or EngineConfig()
        require_vllm()
        if "llvmlite" in sys.modules:   # see engine_common.py: vLLM 0.32's start-up would crash obscurely
            raise RuntimeError("start the vLLM engine before anything imports numba (the KV codec or the "
                               "built-in runner): vLLM 0.32's kernel rebinding fails on llvmlite objects")
        prepare_environment(self.config)
        from vllm.v1.engine.llm_engine import LLMEngine

        self.model_name = model.name
        self.tokenizer = model.tokenizer
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        self.max_model_len = min(self.config.max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings, max_context_tokens(self.config))
        c = model.config
        self._vocab_size = c.vocab_size
        self._kv_layout = KvLayout(c.num_layers, c.num_kv_heads, c.head_dim,
                                   resolve_dtype(self.config.dtype, self.config.device))
        args = engine_args(model.folder, self.config, KV_ROLES.get(role), self.max_model_len)
        self._llm = LLMEngine.from_engine_args(args)
        cache = self._llm.vllm_config.cache_config
        if cache.num_gpu_blocks is None:
            raise RuntimeError("vLLM started without a KV cache (num_gpu_blocks unset)")
        self.block_size, self.num_blocks = int(cache.block_size), int(cache.num_gpu_blocks)
        self._running: dict[str, _Running] = {}
        self._keys = itertools.count()
        self.stats = EngineStats()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def kv_layout(self) -> KvLayout:
        """The connector hands the prompt's KV over in this layout and reads imported KV in it."""
        return self._kv_layout

    @property
    def num_running(self) -> int:
        return len(self._running)

    # ---- prefill side ------------------------------------------------------------------------
    def prefill(self, requests: Sequence[PrefillRequest]) -> list[PrefillResult]:
        for request in requests:
            self._validate_prompt(request.request_id, request.prompt_token_ids)
        keys = {}
        for request in requests:
            keys[request.request_id] = key = self._new_key(request.request_id)
            params = vllm_sampling(request.sampling, max_tokens=1, kv_key=key, capture=True)
            self._llm.add_request(key, vllm_prompt(request.prompt_token_ids, request.cache_salt), params)
        first_tokens: dict[str, int] = {}
        num_cached: dict[str, int] = {}   # prompt tokens vLLM's prefix cache gave
        outputs: dict[str, Any] = {}
        while len(first_tokens) < len(requests):
            if not self._llm.has_unfinished_requests():
                raise RuntimeError(f"vLLM ended {len(requests) - len(first_tokens)} prefill(s) without a token")
            for output in self._llm.step():
                output = cast(Any, output)   # a RequestOutput here: no pooling model is served
                if output.finished and output.outputs and output.outputs[0].token_ids:
                    first_tokens[output.request_id] = int(output.outputs[0].token_ids[0])
                    num_cached[output.request_id] = int(output.num_cached_tokens or 0)
                    outputs[output.request_id] = output
        results = [self._prefill_result(r, keys[r.request_id], first_tokens[keys[r.request_id]],
                                        num_cached[keys[r.request_id]], outputs[keys[r.request_id]]) for r in requests]
        self.stats.num_prefilled_tokens += sum(r.num_prompt_tokens - r.num_cached_tokens for r in results)
        self.stats.num_prefix_cached_tokens += sum(r.num_cached_tokens for r in results)
        return results

    def _prefill_result(self, request: PrefillRequest, key: str, token_id: int, num_cached: int,
                        output: Any) -> PrefillResult:
        kv = MAILBOX.take_capture(key)
        if kv is None:
            raise RuntimeError(f"request {request.request_id}: vLLM finished without handing over the prompt's KV "
                               "(is PdbusConnector configured as kv_producer?)")
        tracker = OutputTracker(self.tokenizer, request.sampling, self.eos_token_ids)
        text, finish_reason = tracker.push(token_id)
        prompt_ids = request.prompt_token_ids
        k = request.sampling.prompt_logprobs
        prompt_logprobs = tuple(passed_logprobs(output.prompt_logprobs, i, t, k) for i, t in enumerate(prompt_ids)) \
            if k is not None and output.prompt_logprobs else ()
        return PrefillResult(request.request_id, token_id, text, kv, len(prompt_ids), finish_reason, num_cached,
                             passed_logprobs(output.outputs[0].logprobs, 0, token_id, request.sampling.logprobs),
                             prompt_logprobs)

    # ---- decode side -------------------------------------------------------------------------
    def check_admission(self, request: DecodeRequest) -> Admission:
        num_prompt = len(request.prompt_token_ids)
        if num_prompt >= self.max_model_len:
            return Admission("rejected", f"prompt of {num_prompt} tokens leaves no room in the context of "
                                         f"{self.max_model_len}")
        num_needed = self._blocks(self._reserved_tokens(request))
        num_free = self.num_blocks - self._blocks_reserved()
        if len(self._running) >= self.config.max_num_seqs:
            return Admission("full", f"{len(self._running)} requests running (max_num_seqs)", num_needed, num_free)
        if num_needed > num_free:
            return Admission("full", f"needs {num_needed} KV blocks, {num_free} free", num_needed, num_free)
        return Admission("ok", "", num_needed, num_free)

    def add_request(self, request: DecodeRequest) -> Admission:
        if request.request_id in self._running:
            return Admission("rejected", f"request {request.request_id} is already running")
        if request.sampling.grammar is not None:
            return Admission("rejected", NO_GRAMMARS)
        if isinstance(request.kv, torch.Tensor) and not bool(torch.isfinite(request.kv).all()):
            # vLLM's step cannot name the request whose KV broke it: refused here, it breaks nothing
            return Admission("rejected", "imported KV holds non-finite values")
        admission = self.check_admission(request)
        if not admission.ok:
            return admission
        prompt = list(request.prompt_token_ids)
        num_reserved = self._reserved_tokens(request)
        tracker = OutputTracker(self.tokenizer, request.sampling, self.eos_token_ids,
                                max_tokens=num_reserved - len(prompt))
        if request.first_token_id is not None:
            tracker.push(request.first_token_id)   # streamed by the prefill node already
            prompt.append(request.first_token_id)
        key = self._new_key(request.request_id)
        if request.kv is not None:
            MAILBOX.offer(key, request.kv)
        params = vllm_sampling(request.sampling, max_tokens=num_reserved - len(prompt), kv_key=key)
        self._running[request.request_id] = _Running(request.request_id, key, tracker, num_reserved,
                                                     len(request.prompt_token_ids), logprobs=request.sampling.logprobs)
        self._llm.add_request(request.request_id, vllm_prompt(prompt, request.cache_salt), params)
        return admission

    def step(self) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        for output in self._llm.step():
            run = self._running.get(output.request_id)
            if run is not None:
                events.extend(self._events(run, output))
        self.stats.num_steps += 1
        return events

    def _events(self, run: _Running, output: Any) -> list[TokenEvent]:
        if not run.seen_first_output:
            run.seen_first_output = True
            num_cached = int(output.num_cached_tokens or 0)
            self.stats.num_imported_tokens += num_cached
            self.stats.num_prefilled_tokens += max(0, run.num_prompt_tokens - num_cached)
        events = []
        token_ids, logprobs = (output.outputs[0].token_ids, output.outputs[0].logprobs) if output.outputs else ((), None)
        for i, token_id in enumerate(token_ids):
            text, finish_reason = run.tracker.push(int(token_id))
            self.stats.num_generated_tokens += 1
            events.append(TokenEvent(run.request_id, int(token_id), text, run.tracker.num_tokens - 1, finish_reason,
                                     passed_logprobs(logprobs, i, int(token_id), run.logprobs)))
            if finish_reason is not None:
                break
        if run.tracker.finish_reason is None and output.finished:
            run.tracker.finish_reason = "length"   # vLLM ended it first (its max_tokens is ours)
            events.append(TokenEvent(run.request_id, None, "", run.tracker.num_tokens, "length"))
        if run.tracker.finish_reason is not None:
            self._forget(run, still_in_vllm=not output.finished)
        return events

    def abort(self, request_id: str) -> TokenEvent | None:
        run = self._running.get(request_id)
        if run is None:
            return None
        self._forget(run, still_in_vllm=True)
        run.tracker.abort()
        return TokenEvent(request_id, None, "", run.tracker.num_tokens, "abort")

    def _forget(self, run: _Running, *, still_in_vllm: bool) -> None:
        self._running.pop(run.request_id, None)
        MAILBOX.withdraw(run.kv_key)
        if still_in_vllm:
            self._llm.abort_request([run.request_id])

    def has_unfinished(self) -> bool:
        return bool(self._running)

    def cached_session_tokens(self, session_id: str) -> int:
        return 0   # no pdbus session cache: a turn's KV moves whole (vLLM's prefix cache may skip loading some)

    def drop_session(self, session_id: str) -> bool:
        return False

    def kv_usage(self) -> KvUsage:
        num_used = min(self.num_blocks, self._blocks_reserved())
        return KvUsage(self.block_size, self.num_blocks, self.num_blocks - num_used, num_used, 0, 0)

    def close(self) -> None:
        for run in list(self._running.values()):
            self._forget(run, still_in_vllm=True)
        shutdown = getattr(self._llm.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()

    # ---- helpers -----------------------------------------------------------------------------
    def _new_key(self, request_id: str) -> str:
        return f"{request_id}#{next(self._keys)}"

    def _reserved_tokens(self, request: DecodeRequest) -> int:
        return min(len(request.prompt_token_ids) + request.sampling.max_tokens, self.max_model_len)

    def _blocks(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def _blocks_reserved(self) -> int:
        return sum(self._blocks(run.num_reserved_tokens) for run in self._running.values())

    def _validate_prompt(self, request_id: str, prompt: Sequence[int]) -> None:
        if not prompt:
            raise ValueError(f"request {request_id}: empty prompt")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"request {request_id}: prompt of {len(prompt)} tokens leaves no room in the "
                             f"model's context of {self.max_model_len}")
        vocab = self.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"request {request_id}: token id outside the vocabulary (0..{vocab - 1})")
