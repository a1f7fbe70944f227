"""The engine contract: what prefill, decode and colocated nodes call, whatever runs the model.

Requests and results are frozen dataclasses (nodes/engines/engine_types.py, re-exported here); the
KV cache crosses the seam as one plain tensor per request, laid out as the engine's `kv_layout`
says, `[num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim]` in its dtype and on the CPU (the
KV codec serialises exactly this; an engine on a GPU copies a prompt's KV out once when its prefill
ends, and copies imported KV in). Token ids are plain ints; text is produced by the engine's
incremental detokenizer so every side agrees on where a multi-byte character ends. A node reads
nothing of an engine that this contract does not name (tests/nodes/engines/test_engine_contract.py
runs one suite against every engine).

Every method of `Engine`, by side:

Prefill side (a `pdbus prefill` node):
    prefill(requests) -> list[PrefillResult]
        Run one batch of prompts (the node's `PrefillBatcher` decides when a batch is ready: a token
        budget or a max wait). Each result carries the first sampled token, its text, the prompt's KV
        (`kv_layout.shape(num_prompt_tokens)`) and a finish reason when the request already ended
        (EOS, stop, max_tokens == 1).
    start_prefill(requests, *, chunk_tokens) -> PrefillPass
        The same batch as a pass the node runs one `step()` (forward pass of at most `chunk_tokens`
        prompt tokens) at a time, so that between two steps it can run an urgent prompt first; a
        prompt cut between steps continues from its KV so far (nothing is recomputed). Its results
        equal `prefill(requests)`'s. Default (`WholePrefill`): one step running `prefill(requests)`,
        for engines that cannot stop inside a pass (the vLLM engine).
    prefix_holdings(limit) -> dict[str, int]
        At most `limit` prefixes its prefix cache holds, most recently used first, as capacity
        names `px.<12 hex>` -> tokens (scheduler/prefix_hashes.py): the node reports them so the
        scheduler routes prompts to the node holding their longest prefix. Default: {}.

Decode side (a `pdbus decode` node):
    check_admission(request) -> Admission   would `add_request` accept it now? (no side effects)
    add_request(request) -> Admission       admit (KV imported, or a cached session extended, or
                                            the prompt queued for a local chunked prefill) or
                                            refuse with status "full" / "rejected" and a reason;
                                            a request id already running is "rejected".
    step() -> list[TokenEvent]              one scheduling round: every running request gets one
                                            token; pending prefill chunks run in the same batch.
    abort(request_id) -> TokenEvent | None  free the request's KV now (idempotent: None when it
                                            is not running).
    unsound_requests() -> list[str]         after `step()` raised: the running requests whose KV
                                            holds non-finite values (verified KV from a buggy or
                                            hostile prefill node), so the node ends those alone.
                                            Runs only on that failure path (may scan their KV).
                                            Default: [] (the node then ends every running request);
                                            an engine that cannot name them refuses such KV at
                                            `add_request` instead ("rejected"), as vLLM's does.
    has_unfinished() -> bool                running requests, or events still to hand out.
    num_running: int                        requests holding KV in the engine now (admitted, not
                                            finished or aborted); at most `max_num_seqs`.
    max_num_seqs: int                       requests that may hold KV at once. Default:
                                            `config.max_num_seqs`.
    cached_session_tokens(session_id) -> int   tokens of a finished session's KV still held (0:
                                            none, or an engine that keeps no sessions).
    drop_session(session_id) -> bool        forget it; False when it was not held.
    hold_prefix(request_id, prompt, salt) -> int   the most leading prompt tokens whose KV this
                                            engine keeps (a session's, or a prefix requests
                                            shared; same salt only), now held for the request
                                            until `add_request` with `cached_prefix_tokens` takes
                                            it or `release_prefix(request_id)`. Default: 0 (an
                                            engine that keeps nothing across requests).
    release_prefix(request_id) -> None     let a held prefix go (idempotent). Default: nothing.
    kv_usage() -> KvUsage
    reserve_kv_memory() -> None            called at node start: allocate the KV budget's memory
                                            now (`preallocate_kv`), not inside a request; again: no-op.
                                            Default: nothing (engines that allocate at construction).
    new_kv(num_tokens) -> torch.Tensor     an uninitialised CPU tensor of `kv_layout.shape(num_tokens)`
                                            in `kv_layout.dtype`: where received KV lands for an
                                            engine that does not copy it (default: `torch.empty`).
    new_device_kv(num_tokens)              the same where the engine keeps its KV (a GPU's memory):
                                            where `[kv] device_codec` decodes int8 / bf16 transfers.
    copies_imported_kv: bool               True when add_request has copied `request.kv` by the
                                            time it returns (the caller may reuse that memory);
                                            False (the default) when the engine reads it later.
                                            Only such engines are handed `request.kv` as
                                            bus.kv.RawPieces (a raw transfer's verified frames).

Colocated (`both`): the decode-side methods with requests that carry no KV; `step()` then
interleaves chunked prefills with decode steps (the vLLM scheduling policy).

Common, set at construction:
    model_name: str, tokenizer: Tokenizer, config: EngineConfig (the settings it was built with)
    max_model_len: int                      the context a request may fill, prompt and output
    vocab_size: int                         token ids are in [0, vocab_size)
    kv_layout: KvLayout                     the KV tensor's layers, heads, head_dim and dtype (the
                                            dtype the engine runs in)
    stats: EngineStats                      counters the nodes report and the cluster asserts on
    kernel_report() -> dict                 what serves each operation (the built-in engine: the
                                            CPU probe and kernels.dispatch's plan); a node logs it
                                            at start. Default: {} (an engine with its own kernels).
    close()                                 release threads and device memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nodes.engines.engine_types import (
    ENGINE_KINDS,
    LOADER_SETTINGS,
    Admission,
    AdmissionStatus,
    DecodeRequest,
    EngineConfig,
    EngineStats,
    FinishReason,
    KvLayout,
    KvUsage,
    PrefillRequest,
    PrefillResult,
    SamplingParams,
    TokenEvent,
    TokenLogprobs,
)

if TYPE_CHECKING:
    import torch

    from nodes.engines.tokenizer import Tokenizer

__all__ = ["ENGINE_KINDS", "LOADER_SETTINGS", "Admission", "AdmissionStatus", "DecodeRequest", "Engine",
           "EngineConfig", "EngineStats", "FinishReason", "KvLayout", "KvUsage", "PrefillPass", "PrefillRequest",
           "PrefillResult", "SamplingParams", "TokenEvent", "TokenLogprobs", "WholePrefill"]


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

    def __init__(self, prefill: Callable[[Sequence[PrefillRequest]], list[PrefillResult]],
                 requests: Sequence[PrefillRequest]) -> None:
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
    tokenizer: Tokenizer
    config: EngineConfig
    max_model_len: int
    stats: EngineStats
    copies_imported_kv: bool = False
    # Set by a prefill node: called (request_id, export) on the engine's thread when a prompt's KV
    # starts leaving the device layer by layer (`EngineConfig.kv_export`), with the object its
    # PrefillResult will carry, so that its transfer may start before the pass ends. Engines that
    # do not export so never call it.
    on_kv_export: Callable[[str, Any], None] | None = None

    # ---- common ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Token ids this engine's model knows: [0, vocab_size)."""

    @property
    @abstractmethod
    def kv_layout(self) -> KvLayout:
        """The layout of every KV tensor that crosses the seam, both ways."""

    def close(self) -> None:
        """Release resources (threads, device memory). Default: nothing to do."""
        return None

    # ---- prefill side ------------------------------------------------------------------------
    @abstractmethod
    def prefill(self, requests: Sequence[PrefillRequest]) -> list[PrefillResult]: ...

    def start_prefill(self, requests: Sequence[PrefillRequest], *, chunk_tokens: int) -> PrefillPass:
        """`prefill(requests)` as an interruptible pass. Default: one uninterruptible step."""
        return WholePrefill(self.prefill, requests)

    def prefix_holdings(self, limit: int) -> dict[str, int]:
        """The prefixes the prefill prefix cache holds, as capacity names (module docstring). Default: {}."""
        return {}

    # ---- decode side -------------------------------------------------------------------------
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

    @property
    @abstractmethod
    def num_running(self) -> int:
        """Requests holding KV in the engine now: admitted, not yet finished or aborted."""

    @property
    def max_num_seqs(self) -> int:
        """Requests that may hold KV at once (a node reports it as `max_running`)."""
        return self.config.max_num_seqs

    @abstractmethod
    def cached_session_tokens(self, session_id: str) -> int: ...

    @abstractmethod
    def drop_session(self, session_id: str) -> bool: ...

    def hold_prefix(self, request_id: str, prompt_token_ids: Sequence[int], salt: str = "") -> int:
        """Hold the longest kept prefix of the prompt for the request (module docstring). Default: none."""
        return 0

    def release_prefix(self, request_id: str) -> None:
        """Let the request's held prefix go. Default: nothing is ever held."""
        return None

    @abstractmethod
    def kv_usage(self) -> KvUsage: ...

    def reserve_kv_memory(self) -> None:
        """Allocate the decode side's KV memory now (see the module docstring). Default: nothing."""
        return None

    def new_kv(self, num_tokens: int) -> torch.Tensor:
        """An uninitialised CPU tensor for `num_tokens` tokens of KV, as `kv_layout` says."""
        # Imported here: the gateway and the wire bodies import this module, and never torch.
        import torch

        layout = self.kv_layout
        return torch.empty(layout.shape(num_tokens), dtype=layout.dtype)

    def new_device_kv(self, num_tokens: int) -> torch.Tensor:
        """As `new_kv`, on the device the engine keeps its KV on: where a received transfer is
        decoded chunk by chunk (nodes/engines/kv_landing.py). Default: the CPU."""
        return self.new_kv(num_tokens)

    def unsound_requests(self) -> list[str]:
        """Running requests whose KV holds non-finite values (see the module docstring). Default: none known."""
        return []

    def kernel_report(self) -> dict[str, object]:
        """What serves each operation, for the start-up log (see the module docstring). Default: {}."""
        return {}
