"""The engine contract: what prefill, decode and colocated nodes call, whatever runs the model.

Requests and results are frozen dataclasses; the KV cache crosses the seam as one plain tensor per
request, laid out ``[num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim]`` in the engine's
dtype and on the CPU (the KV codec serialises exactly this; an engine on a GPU copies a prompt's KV
out once when its prefill ends, and copies imported KV in). Token ids are plain ints; text is
produced by the engine's incremental detokenizer so every side agrees on where a multi-byte
character ends.

Every method of `Engine`, by side:

Prefill side (a `pdbus prefill` node):
    prefill(requests) -> list[PrefillResult]
        Run one batch of prompts (the node's `PrefillBatcher` decides when a batch is ready: a token
        budget or a max wait). Each result carries the first sampled token, its text, the prompt's KV
        and a finish reason when the request already ended (EOS, stop, max_tokens == 1).
    start_prefill(requests, *, chunk_tokens) -> PrefillPass
        The same batch as a pass the node runs one `step()` (forward pass of at most `chunk_tokens`
        prompt tokens) at a time, so that between two steps it can run an urgent prompt first; a
        prompt cut between steps continues from its KV so far (nothing is recomputed). Its results
        equal `prefill(requests)`'s. Default (`WholePrefill`): one step running `prefill(requests)`,
        for engines that cannot stop inside a pass (the vLLM engine).

Decode side (a `pdbus decode` node):
    check_admission(request) -> Admission   would `add_request` accept it now? (no side effects)
    add_request(request) -> Admission       admit (KV imported, or a cached session extended, or
                                            the prompt queued for a local chunked prefill) or
                                            refuse with status "full" / "rejected" and a reason.
    step() -> list[TokenEvent]              one scheduling round: every running request gets one
                                            token; pending prefill chunks run in the same batch.
    abort(request_id) -> TokenEvent | None  free the request's KV now (idempotent).
    unsound_requests() -> list[str]         after `step()` raised: the running requests whose KV
                                            holds non-finite values (verified KV from a buggy or
                                            hostile prefill node), so the node ends those alone.
                                            Runs only on that failure path (may scan their KV).
                                            Default: [] (the node then ends every running request).
    has_unfinished() -> bool
    cached_session_tokens(session_id) -> int   tokens of a finished session's KV still held.
    drop_session(session_id) -> bool
    kv_usage() -> KvUsage
    reserve_kv_memory() -> None            called at node start: allocate the KV budget's memory
                                            now (`preallocate_kv`), not inside a request; again: no-op.
                                            Default: nothing (engines that allocate at construction).
    copies_imported_kv: bool               True when add_request has copied `request.kv` by the
                                            time it returns (the caller may reuse that memory);
                                            False (the default) when the engine reads it later.
                                            Only such engines are handed `request.kv` as
                                            bus.kv.RawPieces (a raw transfer's verified frames).

Colocated (`both`): the decode-side methods with requests that carry no KV; `step()` then
interleaves chunked prefills with decode steps (the vLLM scheduling policy).

Common: `tokenizer`, `model_name`, `config`, `stats` (counters the cluster asserts on), `close()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]
AdmissionStatus = Literal["ok", "full", "rejected"]
LOADER_SETTINGS = frozenset({"model", "model_dir", "kind"})   # read by the node, not the engine
ENGINE_KINDS = ("torch", "vllm")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy; top_k 0 and top_p 1.0 mean "off"."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True, slots=True)
class PrefillResult:
    request_id: str
    first_token_id: int
    text: str                       # text of the first token (may be "" mid UTF-8 character)
    kv: Any                         # torch.Tensor [layers, 2, kv_heads, num_prompt_tokens, head_dim]
    num_prompt_tokens: int
    finish_reason: FinishReason | None = None   # set when the request is already complete


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A request for the decode side.

    - After a remote prefill: `kv` covers every prompt token and `first_token_id` is the token the
      prefill node sampled (and already streamed); decoding starts with no recomputation.
    - `kv` covering only a prefix (or none at all, colocated): the rest is prefilled here in chunks.
    - `session_id` with no `kv`: the longest common prefix with that session's cached KV is reused
      and only the new suffix is prefilled. With `session_id`, the KV is kept after finishing.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    kv: Any = None
    first_token_id: int | None = None
    session_id: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        num_kv = 0 if self.kv is None else int(self.kv.shape[3])
        if num_kv > len(self.prompt_token_ids):
            raise ValueError(f"request {self.request_id}: KV has {num_kv} tokens, prompt only "
                             f"{len(self.prompt_token_ids)}")
        if self.first_token_id is not None and num_kv != len(self.prompt_token_ids):
            raise ValueError(f"request {self.request_id}: first_token_id needs KV for the whole prompt")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token (or the end of a stream). `index` counts output tokens from 0."""

    request_id: str
    token_id: int | None            # None only for an event that just closes the stream
    text: str
    index: int
    finish_reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to "can you take this request?". "full" is transient (try another node or
    later); "rejected" never fits here (e.g. longer than the model's context)."""

    status: AdmissionStatus
    reason: str = ""
    num_blocks_needed: int = 0
    num_blocks_free: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True, slots=True)
class KvUsage:
    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_running_blocks: int
    num_session_blocks: int
    num_sessions: int
    num_slot_cache_bytes: int = 0   # the decode side's KV store: the batch's slots, sessions in its tail (kv_slots.py)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings (the `[engine]` section of the cluster config)."""

    dtype: str = "auto"              # bf16 on a GPU or with bf16 instructions (AMX, AVX512-BF16), else fp32
    device: str = "cpu"
    num_threads: int = 1             # torch threads pinned per engine process
    block_size: int = 16             # KV accounting granularity, tokens
    num_kv_blocks: int = 2048        # KV budget (decode side), blocks of `block_size` tokens
    max_num_seqs: int = 64           # requests holding KV at once (decode side)
    max_batch_tokens: int = 2048     # tokens per forward pass (prefill batch, or decode + chunks)
    prefill_chunk_tokens: int = 256  # longest prefill chunk interleaved with decode steps
    prefill_max_wait_s: float = 0.005
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    keep_sessions: bool = True       # keep finished sessions' KV (LRU within the budget)
    preallocate_kv: bool = True      # decode side: allocate the KV budget's memory at node start
    cuda_graphs: bool = True         # on a CUDA device: pure decode steps replay CUDA graphs (cuda_graphs.py)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        """From the `[engine]` table; `model`/`model_dir` there belong to the model loader."""
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(values) - set(known) - LOADER_SETTINGS)
        if unknown:
            raise ValueError(f"unknown [engine] settings: {', '.join(unknown)}")
        return cls(**known)


class PrefillPass(ABC):
    """A batch of prompts being prefilled, one `step()` at a time (see `Engine.start_prefill`)."""

    @abstractmethod
    def step(self) -> list[PrefillResult]:
        """Run the next forward pass; the results of the prompts it finished (maybe none)."""

    @property
    @abstractmethod
    def done(self) -> bool: ...

    @property
    @abstractmethod
    def num_remaining_tokens(self) -> int:
        """Prompt tokens of this pass still to compute (the node reports them as queued)."""

    def cancel(self, request_id: str) -> bool:
        """Stop computing this prompt (it yields no result). Default: it still runs."""
        return False


class WholePrefill(PrefillPass):
    """The default pass: all the prompts in one `prefill(requests)` call, in a single step."""

    def __init__(self, prefill, requests: Sequence[PrefillRequest]) -> None:
        self._prefill, self._requests = prefill, list(requests)

    def step(self) -> list[PrefillResult]:
        requests, self._requests = self._requests, []
        return self._prefill(requests) if requests else []

    @property
    def done(self) -> bool:
        return not self._requests

    @property
    def num_remaining_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self._requests)

    def cancel(self, request_id: str) -> bool:
        before = len(self._requests)
        self._requests = [r for r in self._requests if r.request_id != request_id]
        return len(self._requests) < before


class Engine(ABC):
    """See the module docstring for the whole contract."""

    model_name: str
    config: EngineConfig
    copies_imported_kv: bool = False

    @abstractmethod
    def prefill(self, requests: Sequence[PrefillRequest]) -> list[PrefillResult]: ...

    def start_prefill(self, requests: Sequence[PrefillRequest], *, chunk_tokens: int) -> PrefillPass:
        """`prefill(requests)` as an interruptible pass. Default: one uninterruptible step."""
        return WholePrefill(self.prefill, requests)

    @abstractmethod
    def check_admission(self, request: DecodeRequest) -> Admission: ...

    @abstractmethod
    def add_request(self, request: DecodeRequest) -> Admission: ...

    @abstractmethod
    def step(self) -> list[TokenEvent]: ...

    @abstractmethod
    def abort(self, request_id: str) -> TokenEvent | None: ...

    @abstractmethod
    def has_unfinished(self) -> bool: ...

    @abstractmethod
    def cached_session_tokens(self, session_id: str) -> int: ...

    @abstractmethod
    def drop_session(self, session_id: str) -> bool: ...

    @abstractmethod
    def kv_usage(self) -> KvUsage: ...

    def reserve_kv_memory(self) -> None:
        """Allocate the decode side's KV memory now (see the module docstring). Default: nothing."""
        return None

    def unsound_requests(self) -> list[str]:
        """Running requests whose KV holds non-finite values (see the module docstring). Default: none known."""
        return []

    def close(self) -> None:
        """Release resources (threads, device memory). Default: nothing to do."""
        return None
