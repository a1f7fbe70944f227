"""The values that cross the engine seam (nodes/engines/base.py is the contract that uses them).

Requests, results and settings are frozen dataclasses, importable without torch: the gateway and
the cluster's wire bodies read `SamplingParams`, and only engine modules import torch (torch appears
here in annotations alone). `KvLayout` says what one request's KV tensor looks like; `EngineStats`
are the counters a node reports in its FINAL bodies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from nodes.engines.grammar_spec import GrammarSpec

if TYPE_CHECKING:
    import torch

    from bus.kv.pieces import RawPieces

FinishReason = Literal["stop", "length", "abort"]
AdmissionStatus = Literal["ok", "full", "rejected"]
LOADER_SETTINGS = frozenset({"model", "model_dir", "kind"})   # read by the node, not the engine
ENGINE_KINDS = ("torch", "vllm")
MAX_LOGPROBS = 20            # alternatives per token (OpenAI's top_logprobs bound)
MAX_LOGIT_BIAS = 1024        # entries of `logit_bias`
MAX_BIAS = 100.0             # |a logit_bias value| (OpenAI's range)
MAX_PENALTY = 2.0            # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0


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
    # None: none reported; k >= 0: each output token's log-probability and the k likeliest tokens'
    # (of the model's raw distribution, before penalties, bias and temperature, as vLLM reports).
    logprobs: int | None = None
    prompt_logprobs: int | None = None      # the same for every prompt token (computed where it is prefilled)
    presence_penalty: float = 0.0           # vLLM's definitions (logits_process.py)
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias added to its logit)
    grammar: GrammarSpec | None = None      # structured output: the text must match it (grammar.py)

    def __post_init__(self) -> None:
        self._check_counts()
        self._check_processing()

    def _check_counts(self) -> None:
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
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")

    def _check_processing(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}], "
                             f"got {self.repetition_penalty}")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has at most {MAX_LOGIT_BIAS} entries")
        if any(token < 0 or not -MAX_BIAS <= bias <= MAX_BIAS for token, bias in self.logit_bias):
            raise ValueError("logit_bias maps token ids >= 0 to biases in [-100, 100]")

    @property
    def processes_logits(self) -> bool:
        """Whether logits change before sampling (penalties, bias, a grammar): greedy needs them too."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.grammar is not None)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One position's log-probabilities: the token's, and the `k` likeliest tokens' (likeliest first)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_salt: str = ""   # prefix-cache keys start from it: prompts share cached KV only under one salt
    num_output_tokens: int = 0   # the prompt's last tokens are output already delivered (a resume)


@dataclass(frozen=True, slots=True)
class PrefillResult:
    request_id: str
    first_token_id: int
    text: str                       # text of the first token (may be "" mid UTF-8 character)
    # On the CPU, `Engine.kv_layout.shape(num_prompt_tokens)`; with `EngineConfig.kv_export` set, a
    # DeviceExport of that shape, encoded for the wire (nodes/engines/kv_export.py).
    kv: Any
    num_prompt_tokens: int
    finish_reason: FinishReason | None = None   # set when the request is already complete
    num_cached_tokens: int = 0      # leading prompt tokens whose KV came from the prefix cache
    logprobs: TokenLogprobs | None = None        # the first token's, when `sampling.logprobs` is set
    # With `sampling.prompt_logprobs`: one entry per prompt token (the first is None: nothing predicts it).
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """A request for the decode side.

    - After a remote prefill: `kv` covers every prompt token and `first_token_id` is the token the
      prefill node sampled (and already streamed); decoding starts with no recomputation.
    - `kv` covering only a prefix (or none at all, colocated): the rest is prefilled here in chunks.
    - `session_id` with no `kv`: the longest common prefix with that session's cached KV is reused
      and only the new suffix is prefilled. With `session_id`, the KV is kept after finishing.
    - `cached_prefix_tokens` k > 0: the KV of the prompt's first k tokens is the prefix the engine
      held for this request (`Engine.hold_prefix`); `kv`, if any, covers the rest of the prompt.
    - `cache_salt`: the tenant; kept KV is found again only under the same salt.
    - `num_output_tokens` k: the prompt's last k tokens are output delivered before (a resume after
      a failover): penalties count them as output.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    kv: torch.Tensor | RawPieces | None = None   # RawPieces: only for an engine that copies_imported_kv
    first_token_id: int | None = None
    session_id: str | None = None
    cached_prefix_tokens: int = 0
    cache_salt: str = ""
    num_output_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        num_kv = self.cached_prefix_tokens + (0 if self.kv is None else int(self.kv.shape[3]))
        if self.cached_prefix_tokens < 0 or num_kv > len(self.prompt_token_ids):
            raise ValueError(f"request {self.request_id}: KV for {num_kv} tokens ({self.cached_prefix_tokens} "
                             f"cached), prompt only {len(self.prompt_token_ids)}")
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
    logprobs: TokenLogprobs | None = None   # when the request asked for them

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
    """The decode side's KV budget in blocks of `block_size` tokens: each block is free, reserved by a
    running request (prompt + max_tokens, at admission) or held by a finished session (or a kept
    prefix), so `num_free_blocks + num_running_blocks + num_session_blocks == num_blocks`.
    `num_pinned_blocks` of the session blocks are held for requests whose KV is on its way
    (`Engine.hold_prefix`): no admission may evict them."""

    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_running_blocks: int
    num_session_blocks: int
    num_sessions: int
    num_slot_cache_bytes: int = 0   # the KV store: the batch's slots, sessions in its tail (kv_slots.py)
    num_pinned_blocks: int = 0


DEVICE_KV_MODES = ("raw", "bf16", "int8")   # the wire modes a GPU engine encodes itself (kv_export.py)
KV_EXPORT_MODES = ("", *DEVICE_KV_MODES)


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
    step_prefill_tokens: int = 0     # most prompt tokens one step prefills, all chunks together (0: what
                                     # max_batch_tokens leaves; a decode node's default: one chunk). The
                                     # built-in engine's; vLLM budgets a step by max_num_batched_tokens
    prefill_max_wait_s: float = 0.005
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    keep_sessions: bool = True       # keep finished sessions' KV (LRU within the budget)
    keep_prefixes: bool = True       # decode side: keep prompt prefixes that requests shared (LRU, same budget)
    prefix_cache_bytes: int = 256 << 20   # prefill side: KV of full prompt blocks kept for reuse (0: off)
    preallocate_kv: bool = True      # decode side: allocate the KV budget's memory at node start
    cuda_graphs: bool = True         # on a CUDA device: pure decode steps replay CUDA graphs (cuda_graphs.py)
    kv_export: str = ""              # prefill side: "" hands a prompt's KV out as a CPU tensor; a wire mode
                                     # (int8, bf16, raw) encodes it on the device as layers finish (kv_export.py)

    def __post_init__(self) -> None:
        if self.kv_export not in KV_EXPORT_MODES:
            raise ValueError(f"[engine] kv_export must be one of {KV_EXPORT_MODES}, got {self.kv_export!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        """From the `[engine]` table; `model`/`model_dir` there belong to the model loader."""
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        unknown = sorted(set(values) - set(known) - LOADER_SETTINGS)
        if unknown:
            raise ValueError(f"unknown [engine] settings: {', '.join(unknown)}")
        return cls(**known)


@dataclass(frozen=True, slots=True)
class KvLayout:
    """What one request's KV tensor is: `[num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim]`
    in `dtype`, on the CPU, contiguous. The KV codec serialises exactly this, and a decode node takes
    a transfer only when its header has this shape (nodes/decode_kv.py)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def shape(self, num_tokens: int) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.num_kv_heads, num_tokens, self.head_dim)

    def num_bytes(self, num_tokens: int) -> int:
        return self.num_layers * 2 * self.num_kv_heads * num_tokens * self.head_dim * self.dtype.itemsize

    @property
    def dtype_name(self) -> str:
        """"float32", "bfloat16", ...: the dtype as a node logs it."""
        return str(self.dtype).removeprefix("torch.")


@dataclass(slots=True)
class EngineStats:
    """Counters the engine keeps; the nodes put them in their FINAL bodies, and the cluster tests
    assert on them (KV imported rather than recomputed, a session's KV reused)."""

    num_prefilled_tokens: int = 0     # prompt tokens this engine computed KV for
    num_imported_tokens: int = 0      # tokens whose KV arrived from elsewhere
    num_reused_tokens: int = 0        # tokens whose KV came from a cached session
    num_prefix_reused_tokens: int = 0  # decode side: prompt tokens whose KV came from a kept prefix
    num_prefix_cached_tokens: int = 0  # prompt tokens whose KV came from the prefill prefix cache
    num_generated_tokens: int = 0
    num_steps: int = 0
