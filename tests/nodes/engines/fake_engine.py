"""`CountingEngine`: the smallest `Engine` a node can run, written from the contract alone (no runner,
no model). Its "model" samples `(previous token + 1) % vocab_size` and a prompt's KV holds each
token's id in all its elements. A request is charged blocks of `block_size` for prompt + max_tokens;
a finished session keeps blocks for its tokens until a request needs them (LRU first). `step()`
raises while a running request's imported KV is not finite (as a model would compute NaN from it),
and `unsound_requests()` names that request.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bus.kv import RawPieces
from nodes.engines.base import (
    Admission,
    DecodeRequest,
    Engine,
    EngineConfig,
    EngineStats,
    KvLayout,
    KvUsage,
    PrefillRequest,
    PrefillResult,
    TokenEvent,
)
from nodes.engines.output import OutputTracker
from nodes.engines.tiny import EOS_TOKEN_ID, tiny_tokenizer

VOCAB_SIZE = 256


@dataclass
class _Seq:
    request_id: str
    token_ids: list[int]
    tracker: OutputTracker
    num_blocks: int
    session_id: str | None
    kv: torch.Tensor | None


class CountingEngine(Engine):
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(dtype="float32")
        self.model_name = "counting"
        self.tokenizer = tiny_tokenizer(VOCAB_SIZE)
        self.max_model_len = self.config.max_model_len or 128
        self.stats = EngineStats()
        self._layout = KvLayout(num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32)
        self._running: dict[str, _Seq] = {}
        self._sessions: OrderedDict[str, tuple[list[int], int]] = OrderedDict()   # tokens, blocks
        self._pending: list[TokenEvent] = []

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    @property
    def kv_layout(self) -> KvLayout:
        return self._layout

    @property
    def num_running(self) -> int:
        return len(self._running)

    def prefill(self, requests: Sequence[PrefillRequest]) -> list[PrefillResult]:
        results = []
        for request in requests:
            prompt = request.prompt_token_ids
            if problem := self._refusal(prompt):
                raise ValueError(f"request {request.request_id}: {problem}")
            token = (prompt[-1] + 1) % VOCAB_SIZE
            text, finish = OutputTracker(self.tokenizer, request.sampling, (EOS_TOKEN_ID,)).push(token)
            results.append(PrefillResult(request.request_id, token, text, self._kv_of(prompt), len(prompt), finish))
            self.stats.num_prefilled_tokens += len(prompt)
        return results

    def check_admission(self, request: DecodeRequest) -> Admission:
        if problem := self._refusal(request.prompt_token_ids, request.kv):
            return Admission("rejected", problem)
        needed, free = self._blocks_for(request), self._num_free_blocks() + self._num_session_blocks()
        if self.num_running >= self.max_num_seqs:
            return Admission("full", f"{self.num_running} requests running (max_num_seqs)", needed, free)
        if needed > free:
            return Admission("full", f"needs {needed} KV blocks, {free} free", needed, free)
        return Admission("ok", "", needed, free)

    def add_request(self, request: DecodeRequest) -> Admission:
        if request.request_id in self._running:
            return Admission("rejected", f"request {request.request_id} is already running")
        admission = self.check_admission(request)
        if not admission.ok:
            return admission
        while admission.num_blocks_needed > self._num_free_blocks():   # finished sessions give way, LRU first
            self._sessions.popitem(last=False)
        tokens = list(request.prompt_token_ids)
        reused = self._sessions.pop(request.session_id, None) if request.session_id else None
        num_imported = 0 if request.kv is None else int(request.kv.shape[3])
        num_reused = 0
        if reused is not None and request.kv is None:
            same = itertools.takewhile(lambda pair: pair[0] == pair[1], zip(reused[0], tokens[:-1], strict=False))
            num_reused = sum(1 for _ in same)
        self.stats.num_imported_tokens += num_imported
        self.stats.num_reused_tokens += num_reused
        self.stats.num_prefilled_tokens += len(tokens) - num_imported - num_reused
        tracker = OutputTracker(self.tokenizer, request.sampling, (EOS_TOKEN_ID,),
                                max_tokens=self.max_model_len - len(tokens))
        seq = _Seq(request.request_id, tokens, tracker, admission.num_blocks_needed, request.session_id,
                   None if request.kv is None else torch.as_tensor(request.kv).clone())
        self._running[seq.request_id] = seq
        if request.first_token_id is not None:
            tokens.append(request.first_token_id)
            if tracker.push(request.first_token_id)[1] is not None:
                self._pending.append(TokenEvent(seq.request_id, None, "", 1, tracker.finish_reason))
                self._retire(seq)
        return admission

    def step(self) -> list[TokenEvent]:
        if unsound := self.unsound_requests():
            raise FloatingPointError(f"non-finite KV in {unsound}")
        events, self._pending = self._pending, []
        for seq in list(self._running.values()):
            token = (seq.token_ids[-1] + 1) % VOCAB_SIZE
            seq.token_ids.append(token)
            text, finish = seq.tracker.push(token)
            events.append(TokenEvent(seq.request_id, token, text, seq.tracker.num_tokens - 1, finish))
            self.stats.num_generated_tokens += 1
            if finish is not None:
                self._retire(seq)
        self.stats.num_steps += 1
        return events

    def abort(self, request_id: str) -> TokenEvent | None:
        seq = self._running.pop(request_id, None)
        if seq is None:
            return None
        seq.tracker.abort()
        return TokenEvent(request_id, None, "", seq.tracker.num_tokens, "abort")

    def unsound_requests(self) -> list[str]:
        return [s.request_id for s in self._running.values() if s.kv is not None and not bool(s.kv.isfinite().all())]

    def has_unfinished(self) -> bool:
        return bool(self._running or self._pending)

    def cached_session_tokens(self, session_id: str) -> int:
        return len(self._sessions[session_id][0]) if session_id in self._sessions else 0

    def drop_session(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    def kv_usage(self) -> KvUsage:
        num_running = sum(s.num_blocks for s in self._running.values())
        return KvUsage(self.config.block_size, self.config.num_kv_blocks, self._num_free_blocks(), num_running,
                       self._num_session_blocks(), len(self._sessions))

    # ---- helpers -------------------------------------------------------------------------------
    def _refusal(self, prompt: Sequence[int], kv: torch.Tensor | RawPieces | None = None) -> str:
        if kv is not None and tuple(kv.shape) != self._layout.shape(int(kv.shape[3])):
            return f"KV shape {tuple(kv.shape)} does not match {self._layout.shape(int(kv.shape[3]))}"
        if len(prompt) + 1 > self.max_model_len:
            return f"prompt of {len(prompt)} tokens leaves no room in the context of {self.max_model_len}"
        if min(prompt) < 0 or max(prompt) >= VOCAB_SIZE:
            return f"token id outside the vocabulary (0..{VOCAB_SIZE - 1})"
        return ""

    def _kv_of(self, prompt: Sequence[int]) -> torch.Tensor:
        kv = torch.empty(self._layout.shape(len(prompt)), dtype=self._layout.dtype)
        kv.copy_(torch.tensor(prompt, dtype=kv.dtype).view(1, 1, 1, -1, 1).expand_as(kv))
        return kv

    def _blocks_for(self, request: DecodeRequest) -> int:
        num_tokens = min(len(request.prompt_token_ids) + request.sampling.max_tokens, self.max_model_len)
        return math.ceil(num_tokens / self.config.block_size)

    def _num_session_blocks(self) -> int:
        return sum(blocks for _, blocks in self._sessions.values())

    def _num_free_blocks(self) -> int:
        used = sum(s.num_blocks for s in self._running.values()) + self._num_session_blocks()
        return self.config.num_kv_blocks - used

    def _retire(self, seq: _Seq) -> None:
        del self._running[seq.request_id]
        if seq.session_id and self.config.keep_sessions:
            computed = seq.token_ids[:-1]   # the last token's KV is computed by the step after it
            self._sessions[seq.session_id] = (computed, math.ceil(len(computed) / self.config.block_size))
