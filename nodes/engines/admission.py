"""Admission control for the decode side: does a request fit in the KV budget, and what must give way.

Contract: `AdmissionPlanner.plan(request, num_running) -> Plan` decides without side effects.
A request is charged its reservation, prompt + max_tokens tokens (capped by the context), in
blocks; reserving up front means a running request never needs memory that is not there, so the
engine never preempts and never runs out. The physical slot cache is padded (every slot as long as
the longest reservation), so the planner also checks that the padded cache plus the cached
sessions fit in the budget. Finished sessions (and kept prompt prefixes, session_cache.py) are
evicted least recently used first, and only when that makes the request fit. A pinned entry (held
for a request whose KV is on its way, prefix_leases.py) is never evicted, taken or dropped: a
session superseded while pinned stays as an anonymous prefix entry until its pins are gone. Answers: "ok"; "full" (transient: busy now, try another node or later);
"rejected" (never fits here, or malformed), always with a reason a human can act on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from nodes.engines.base import Admission, DecodeRequest, EngineConfig
from nodes.engines.block_manager import BlockManager
from nodes.engines.kv_slots import SlotCache
from nodes.engines.model_config import LlamaConfig
from nodes.engines.session_cache import PREFIX_OWNER, CachedSession, SessionCache, common_prefix_len


@dataclass(slots=True)
class Plan:
    admission: Admission
    num_reserved_tokens: int = 0
    reuse_session: str | None = None      # take this session (its KV prefix is reused or dropped)
    num_reused_tokens: int = 0
    evict_sessions: list[str] = field(default_factory=list)


class AdmissionPlanner:
    def __init__(self, config: EngineConfig, blocks: BlockManager, sessions: SessionCache, slots: SlotCache,
                 max_model_len: int, model: LlamaConfig) -> None:
        self._config = config
        self._blocks = blocks
        self._sessions = sessions
        self._slots = slots
        self._max_model_len = max_model_len
        self._model = model
        self._prefix_ids = itertools.count()

    @staticmethod
    def session_owner(session_id: str) -> str:
        return f"session:{session_id}"

    def plan(self, request: DecodeRequest, *, num_running: int, lease: CachedSession | None = None) -> Plan:
        """`lease`: the entry this request holds its cached prefix from (pinned for it)."""
        problem = self._malformed(request)
        if problem:
            return Plan(Admission("rejected", problem))
        reserve = min(len(request.prompt_token_ids) + request.sampling.max_tokens, self._max_model_len)
        needed = self._blocks.num_blocks_for(reserve)
        if needed > self._blocks.num_blocks:
            return Plan(Admission("rejected", f"needs {needed} KV blocks, the whole budget is {self._blocks.num_blocks}",
                                  needed, self._blocks.num_free_blocks))
        if num_running >= self._config.max_num_seqs:
            return Plan(Admission("full", f"{num_running} requests running (max_num_seqs)", needed,
                                  self._blocks.num_free_blocks))
        plan = Plan(Admission("ok"), num_reserved_tokens=reserve)
        self._plan_reuse(request, plan, lease)
        return self._fit(plan, needed, num_running)

    def _malformed(self, request: DecodeRequest) -> str:
        num_tokens = len(request.prompt_token_ids)
        if num_tokens + 1 > self._max_model_len:
            return f"prompt of {num_tokens} tokens leaves no room in the context of {self._max_model_len}"
        if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= self._model.vocab_size:
            return f"token id outside the vocabulary (0..{self._model.vocab_size - 1})"
        if request.kv is not None:
            m = self._model
            expected = (m.num_layers, 2, m.num_kv_heads, int(request.kv.shape[3]), m.head_dim)
            if tuple(request.kv.shape) != expected:
                return f"KV shape {tuple(request.kv.shape)} does not match the model's {expected}"
        return ""

    def _plan_reuse(self, request: DecodeRequest, plan: Plan, lease: CachedSession | None) -> None:
        session = self._sessions.get(request.session_id) if request.session_id else None
        if session is None or session.pins > (session is lease):   # held for another request: left alone
            return
        plan.reuse_session = session.session_id   # taken either way: reused, or superseded by new KV
        if request.kv is None and not request.cached_prefix_tokens:
            common = common_prefix_len(session.token_ids, request.prompt_token_ids)
            plan.num_reused_tokens = min(common, len(request.prompt_token_ids) - 1)

    def _fit(self, plan: Plan, needed: int, num_running: int) -> Plan:
        block_size = self._blocks.block_size
        budget_tokens = self._blocks.num_blocks * block_size
        free = self._blocks.num_free_blocks
        held = {s: self._blocks.num_blocks_of(self.session_owner(s)) for s in self._sessions.lru_order()}
        if plan.reuse_session:
            free += held.pop(plan.reuse_session)
        session_tokens = sum(held.values()) * block_size
        evictable = [s for s in held if not self._pinned(s)]
        while True:
            slots, capacity = self._slots.layout_after(num_running + 1, self._longest_reservation(plan),
                                                       budget_tokens - session_tokens)
            if needed <= free and slots * capacity + session_tokens <= budget_tokens:
                break
            if not evictable:
                reason = (f"KV budget full: needs {needed} blocks, {free} free; padded slot cache "
                          f"{slots}x{capacity} tokens + {session_tokens} cached-session tokens "
                          f"vs budget {budget_tokens}")
                return Plan(Admission("full", reason, needed, self._blocks.num_free_blocks))
            victim = evictable.pop(0)
            plan.evict_sessions.append(victim)
            free += held[victim]
            session_tokens -= held[victim] * block_size
        plan.admission = Admission("ok", "", needed, self._blocks.num_free_blocks)
        return plan

    def slot_budget_tokens(self) -> int:
        """Tokens the slot cache may take: the budget minus what cached sessions hold."""
        num_session_blocks = sum(self._blocks.num_blocks_of(self.session_owner(s)) for s in self._sessions.lru_order())
        return (self._blocks.num_blocks - num_session_blocks) * self._blocks.block_size

    def _longest_reservation(self, plan: Plan) -> int:
        return max(plan.num_reserved_tokens, self._slots.capacity)

    # ---- session bookkeeping (the engine owns the tensors, this owns the blocks) -----------------
    def take_session(self, session_id: str) -> CachedSession | None:
        self._blocks.free(self.session_owner(session_id))
        return self._sessions.take(session_id)

    def drop_session(self, session_id: str) -> bool:
        """Forget the session; a pinned one stays, as an anonymous prefix entry."""
        pinned = self._sessions.get(session_id)
        if pinned is not None and pinned.pins:
            new_id = self.new_prefix_id()
            self._blocks.rename(self.session_owner(session_id), self.session_owner(new_id))
            self._sessions.rekey(pinned, new_id)
            return True
        session = self.take_session(session_id)
        if session is not None:
            self._slots.forget(session)
        return session is not None

    def new_prefix_id(self) -> str:
        return f"{PREFIX_OWNER}{next(self._prefix_ids)}"

    def _pinned(self, session_id: str) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and session.pins > 0

    def keep_session(self, session: CachedSession) -> bool:
        """Account a finished session (its payload is the caller's to fill), evicting older
        sessions if the budget requires it; False when it cannot be kept at all."""
        self.drop_session(session.session_id)
        needed = self._blocks.num_blocks_for(len(session.token_ids))
        for victim in self._sessions.lru_order():
            if self._blocks.can_allocate(needed):
                break
            if not self._pinned(victim):
                self.drop_session(victim)
        if not self._blocks.can_allocate(needed):
            return False
        self._blocks.allocate(self.session_owner(session.session_id), len(session.token_ids))
        self._sessions.put(session)
        return True
