"""`LlamaEngine`: the built-in torch engine behind the `Engine` contract (see `base.py`).

One engine serves either side or both. `step()` has nano-vllm's shape: `schedule()` picks this
step's chunks (decode tokens first, then prefill chunks), `_run()` packs them into one forward pass
(`batch_pack.py`), `_postprocess()` samples (each request's penalties, bias and grammar applied
first: `logits_process.py`; its logprobs when asked), streams and retires finished requests. A
grammar that does not compile is `rejected` at admission; the compiler (llguidance) is built at the
first request with one. Admission (`admission.py`) charges each request its KV reservation (prompt +
max_tokens, in blocks) and the padded slot cache it implies, evicting least-recently-used kept KV
first (finished sessions, shared prefixes: `session_cache.py`; never one held for a request,
`prefix_leases.py`), and answers "full" rather than over-committing memory; an admitted request
becomes a running sequence in `sequence_start.py`, and the slot store is reserved up front in
`kv_reservation.py`. Torch threads are pinned at construction (`num_threads`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from nodes.engines.admission import AdmissionPlanner
from nodes.engines.base import (
    Admission,
    DecodeRequest,
    Engine,
    EngineConfig,
    KvLayout,
    KvUsage,
    PrefillPass,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
)
from nodes.engines.batch_pack import pack
from nodes.engines.block_manager import BlockManager
from nodes.engines.engine_common import resolve_device, resolve_dtype
from nodes.engines.engine_types import EngineStats
from nodes.engines.kernels.cpu import probe
from nodes.engines.kv_export import new_export
from nodes.engines.kv_reservation import reserve_slot_store
from nodes.engines.kv_slots import SlotCache
from nodes.engines.llama import LlamaRunner
from nodes.engines.logits_process import RequestLogits, sampled_logprobs
from nodes.engines.model_loader import LoadedModel
from nodes.engines.prefill_pass import ChunkedPrefill, run_prefill
from nodes.engines.prefix_cache import PrefixCache
from nodes.engines.prefix_leases import DecodePrefixes, Lease
from nodes.engines.sampling import sample
from nodes.engines.sequence_start import start_sequence
from nodes.engines.session_cache import CachedSession, SessionCache
from nodes.engines.step_schedule import ScheduledChunk, Sequence, schedule

if TYPE_CHECKING:   # llguidance is imported at the first request with a grammar
    from nodes.engines.grammar import GrammarCompiler

class LlamaEngine(Engine):
    copies_imported_kv = True   # add_request writes request.kv into the slot cache before returning

    def __init__(self, model: LoadedModel, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        torch.set_num_threads(self.config.num_threads)
        self.model_name = model.name
        self.tokenizer = model.tokenizer
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        self.max_model_len = min(self.config.max_model_len or model.config.max_position_embeddings,
                                 model.config.max_position_embeddings)
        device = resolve_device(self.config.device)
        self.runner = LlamaRunner(model.config, model.weights, dtype=resolve_dtype(self.config.dtype, self.config.device),
                                  device=device, max_len=self.max_model_len,
                                  cuda_graphs=self.config.cuda_graphs)
        self.device = self.runner.device
        self.runner.new_export = functools.partial(new_export, self)
        self.blocks = BlockManager(self.config.num_kv_blocks, self.config.block_size)
        self.sessions = SessionCache(self.config.block_size)
        self.prefixes = DecodePrefixes(self.sessions, self.config.block_size, self.config.keep_prefixes)
        self.slots = SlotCache(model.config, dtype=self.runner.dtype, device=self.device,
                               max_slots=self.config.max_num_seqs, max_len=self.max_model_len,
                               budget_tokens=self.config.num_kv_blocks * self.config.block_size)
        self.planner = AdmissionPlanner(self.config, self.blocks, self.sessions, self.slots, self.max_model_len,
                                        model.config)
        self.running: list[Sequence] = []          # index == slot
        self._pending_events: list[TokenEvent] = []
        self.stats = EngineStats()
        # Prefill side: full prompt blocks' KV kept for prompts that share a prefix (prefix_cache.py).
        self.prefix_cache = PrefixCache(self.config.block_size, self.config.prefix_cache_bytes)
        # Test/debug hook: on_logits(request_ids, logits) after each forward.
        self.on_logits: Callable[[list[str], torch.Tensor], None] | None = None
        c = model.config
        self._kv_layout = KvLayout(c.num_layers, c.num_kv_heads, c.head_dim, self.runner.dtype)

    @property
    def vocab_size(self) -> int:
        return self.runner.config.vocab_size

    @property
    def kv_layout(self) -> KvLayout:
        return self._kv_layout

    def new_device_kv(self, num_tokens: int) -> torch.Tensor:
        return torch.empty(self._kv_layout.shape(num_tokens), dtype=self.runner.dtype, device=self.device)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- prefill side ------------------------------------------------------------------------
    def prefill(self, requests: Seq[PrefillRequest]) -> list[PrefillResult]:
        results = run_prefill(self.runner, self.tokenizer, requests, max_batch_tokens=self.config.max_batch_tokens,
                              max_model_len=self.max_model_len, eos_token_ids=self.eos_token_ids,
                              cache=self.prefix_cache, grammars=lambda: self.grammars)
        self.stats.num_prefilled_tokens += sum(r.num_prompt_tokens - r.num_cached_tokens for r in results)
        self.stats.num_prefix_cached_tokens += sum(r.num_cached_tokens for r in results)
        return results

    def start_prefill(self, requests: Seq[PrefillRequest], *, chunk_tokens: int) -> PrefillPass:
        return ChunkedPrefill(self.runner, self.tokenizer, requests, chunk_tokens=chunk_tokens,
                              max_model_len=self.max_model_len, eos_token_ids=self.eos_token_ids, stats=self.stats,
                              cache=self.prefix_cache, grammars=lambda: self.grammars)

    @functools.cached_property
    def grammars(self) -> GrammarCompiler:
        """Structured output's compiler (llguidance), built at the first request with a grammar."""
        from nodes.engines.grammar import GrammarCompiler
        return GrammarCompiler(self.tokenizer, self.runner.config.vocab_size)

    def prefix_holdings(self, limit: int) -> dict[str, int]:
        return self.prefix_cache.holdings(limit)

    # ---- decode side -------------------------------------------------------------------------
    def check_admission(self, request: DecodeRequest) -> Admission:
        return self.planner.plan(request, num_running=len(self.running)).admission

    def hold_prefix(self, request_id: str, prompt_token_ids: Seq[int], salt: str = "") -> int:
        return self.prefixes.hold(request_id, prompt_token_ids, salt)

    def release_prefix(self, request_id: str) -> None:
        self.prefixes.release(request_id)

    def add_request(self, request: DecodeRequest) -> Admission:
        if any(seq.request_id == request.request_id for seq in self.running):
            return Admission("rejected", f"request {request.request_id} is already running")
        try:
            processor = RequestLogits.for_request(request.sampling, request.prompt_token_ids,
                                                  request.num_output_tokens, self._grammars_for(request.sampling))
        except ValueError as exc:   # a grammar this engine cannot compile: it never will
            return Admission("rejected", str(exc))
        lease = self.prefixes.lease(request.request_id) if request.cached_prefix_tokens else None
        if request.cached_prefix_tokens and (lease is None or lease.num_tokens < request.cached_prefix_tokens):
            return Admission("rejected", f"no cached prefix of {request.cached_prefix_tokens} tokens is held "
                                         f"for request {request.request_id}")
        plan = self.planner.plan(request, num_running=len(self.running), lease=lease.entry if lease else None)
        if not plan.admission.ok:
            return plan.admission   # a lease stays held: the caller releases it, or tries again
        for session_id in plan.evict_sessions:
            self.planner.drop_session(session_id)
        reused = self.planner.take_session(plan.reuse_session) if plan.reuse_session else None
        seq = start_sequence(request, plan.num_reserved_tokens, processor, self.tokenizer, self.eos_token_ids)
        seq.cache_salt, seq.prefix_keys = request.cache_salt, self.prefixes.keys(request.prompt_token_ids,
                                                                               request.cache_salt)
        self.prefixes.observe(seq.prefix_keys)
        self.blocks.allocate(seq.request_id, plan.num_reserved_tokens)
        self.slots.ensure(len(self.running) + 1, max([plan.num_reserved_tokens] +
                                                    [s.num_reserved_tokens for s in self.running]),
                          self.planner.slot_budget_tokens(),
                          max((s.num_computed_tokens for s in self.running), default=0))
        seq.slot = len(self.running)
        self.running.append(seq)
        self._load_kv(seq, request, reused, plan.num_reused_tokens, lease)
        self.prefixes.release(request.request_id)   # copied into its slot
        if reused is not None:   # copied into its slot (or superseded): its room in the tail is free
            self.slots.forget(reused)
        return plan.admission

    def _grammars_for(self, sampling: SamplingParams) -> GrammarCompiler | None:
        return self.grammars if sampling.grammar is not None else None

    def _load_kv(self, seq: Sequence, request: DecodeRequest, reused: CachedSession | None,
                 num_reused: int, lease: Lease | None) -> None:
        num_cached = request.cached_prefix_tokens
        if lease is not None and num_cached:
            self.slots.write(seq.slot, lease.entry.payload[:, :, :, :num_cached])
            seq.num_computed_tokens = num_cached
            self.stats.num_prefix_reused_tokens += num_cached
        if request.kv is not None:
            self.slots.write(seq.slot, request.kv, num_cached)
            # KV for the whole prompt but no first token: the last prompt token runs again (its
            # KV is rewritten identically) because its logits are needed to sample.
            seq.num_computed_tokens = min(num_cached + int(request.kv.shape[3]), len(seq.token_ids) - 1)
            self.stats.num_imported_tokens += seq.num_computed_tokens - num_cached
        elif reused is not None and num_reused and not num_cached:
            self.slots.write(seq.slot, reused.payload[:, :, :, :num_reused])
            seq.num_computed_tokens = num_reused
            self.stats.num_reused_tokens += num_reused
        if seq.output.finish_reason is not None:   # the imported first token already ended it
            self._pending_events.append(TokenEvent(seq.request_id, None, "", 1, seq.output.finish_reason))
            self._retire(seq, keep_session=True)

    def step(self) -> list[TokenEvent]:
        events, self._pending_events = self._pending_events, []
        chunks = schedule(self.running, max_batch_tokens=self.config.max_batch_tokens,
                          prefill_chunk_tokens=self.config.prefill_chunk_tokens,
                          max_prefill_tokens=self.config.step_prefill_tokens)
        if chunks:
            logits = self._run(chunks)
            events.extend(self._postprocess(chunks, logits))
        return events

    def _run(self, chunks: list[ScheduledChunk]) -> torch.Tensor:
        batch = pack(chunks, self.slots, len(self.running), self.device)
        # On a GPU the logits stay there: sampling copies out a token id per greedy row, not a row of
        # 49,152 logits (sampling.py), and only a random-sampled row's logits come to the CPU.
        logits = self.runner.forward(batch)
        self.stats.num_steps += 1
        self.stats.num_prefilled_tokens += sum(max(0, min(c.start + c.num_tokens, c.seq.num_prompt_tokens) - c.start)
                                               for c in chunks)
        if self.on_logits is not None:
            self.on_logits([c.seq.request_id for c in chunks if c.samples], logits)
        return logits

    def _postprocess(self, chunks: list[ScheduledChunk], logits: torch.Tensor) -> list[TokenEvent]:
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        sampled = [c for c in chunks if c.samples]
        tokens = sample(logits, [c.seq.sampling for c in sampled], [c.seq.generator for c in sampled],
                        [c.seq.processor for c in sampled])
        logprobs = sampled_logprobs(logits, [c.seq.sampling for c in sampled], tokens)
        events = []
        for chunk, token, token_lp in zip(sampled, tokens, logprobs, strict=True):
            seq = chunk.seq
            seq.token_ids.append(token)
            if seq.processor is not None:
                seq.processor.accept(token)
            text, finish_reason = seq.output.push(token)
            events.append(TokenEvent(seq.request_id, token, text, seq.num_output_tokens - 1, finish_reason,
                                     token_lp))
            self.stats.num_generated_tokens += 1
            if finish_reason is not None:
                self._retire(seq, keep_session=True)
        return events

    def unsound_requests(self) -> list[str]:
        # Only after a step raised: a scan of each running slot's computed KV (its cost does not matter there).
        return [seq.request_id for seq in self.running
                if not bool(torch.isfinite(self.slots.view(seq.slot)[:, :, :, :seq.num_computed_tokens]).all())]

    def kernel_report(self) -> dict[str, object]:
        report: dict[str, object] = {"kernels": self.runner.kernels.as_log()}
        if self.device.type == "cpu":
            report["cpu_features"] = probe().as_log()
        return report

    def abort(self, request_id: str) -> TokenEvent | None:
        seq = next((s for s in self.running if s.request_id == request_id), None)
        if seq is None:
            return None
        seq.output.abort()
        self._retire(seq, keep_session=False)
        return TokenEvent(request_id, None, "", seq.num_output_tokens, "abort")

    def _retire(self, seq: Sequence, *, keep_session: bool) -> None:
        self.blocks.free(seq.request_id)
        if keep_session and seq.session_id and self.config.keep_sessions:
            token_ids = tuple(seq.token_ids[:seq.num_computed_tokens])
            self._keep(CachedSession(seq.session_id, token_ids, None, seq.cache_salt,
                                     self.prefixes.full_keys(token_ids, seq.cache_salt, seq.prefix_keys)), seq.slot)
        elif keep_session and (depth := self.prefixes.depth_to_keep(seq.prefix_keys)):
            num_tokens = depth * self.config.block_size   # prompt blocks another request shared
            self._keep(CachedSession(self.planner.new_prefix_id(), tuple(seq.token_ids[:num_tokens]), None,
                                     seq.cache_salt, seq.prefix_keys[:depth]), seq.slot)
        last = self.running.pop()
        if last is not seq:   # keep slots dense: the last request moves into the freed slot
            self.slots.move(last.slot, seq.slot, last.num_computed_tokens)
            last.slot = seq.slot
            self.running[seq.slot] = last
        if not self.running:
            self.slots.idle()   # its store stays for the next request: new memory faults in slowly (kv_slots.py)

    def _keep(self, entry: CachedSession, slot: int) -> None:
        if self.planner.keep_session(entry):   # its KV goes to the store's tail (kv_slots.keep)
            self.slots.keep(entry, slot, len(entry.token_ids))

    def has_unfinished(self) -> bool:
        return bool(self.running or self._pending_events)

    def reserve_kv_memory(self) -> None:
        """The slot store for the whole budget, faulted in now (kv_reservation.py); KVMemoryError
        when the budget exceeds the memory available. A second call does nothing."""
        reserve_slot_store(self.slots, self.planner.slot_budget_tokens(), self.config, self.device)

    # ---- sessions and usage --------------------------------------------------------------------
    def cached_session_tokens(self, session_id: str) -> int:
        session = self.sessions.get(session_id)
        return 0 if session is None else len(session.token_ids)

    def drop_session(self, session_id: str) -> bool:
        return self.planner.drop_session(session_id)

    def kv_usage(self) -> KvUsage:
        held = [(e, self.blocks.num_blocks_of(self.planner.session_owner(e.session_id))) for e in self.sessions.entries()]
        return KvUsage(self.blocks.block_size, self.blocks.num_blocks, self.blocks.num_free_blocks,
                       sum(self.blocks.num_blocks_of(s.request_id) for s in self.running), sum(n for _, n in held),
                       len(self.sessions), self.slots.num_bytes, sum(n for e, n in held if e.pins))
