"""The main of an engine node process, shared by `pdbus prefill`, `pdbus decode` and
`pdbus node --role both`: settings -> engine -> `run_node` with the role's works.

Contract: `serve_role(args, role) -> int` (exit code; 2 with one line on stderr when the model or
the settings are unusable, the KV budget included: a decode side reserves its memory here).
"""

from __future__ import annotations

import argparse
import sys
import time

from bus.log import get_logger
from nodes.engines.base import Engine
from nodes.runtime import prefer_passive_openmp


def serve_role(args: argparse.Namespace, role: str) -> int:
    prefer_passive_openmp()   # before torch is imported
    from nodes.engines.model_loader import ModelLoadError
    from nodes.engines.vllm_args import VllmUnavailable
    from nodes.node_settings import node_settings
    from nodes.runtime import build_engine, run_node

    settings = node_settings(args, role)
    try:
        engine = build_engine(settings)
        if role != "prefill":
            _reserve_kv(engine, role)   # here, to fail with one line (DecodeWork.prepare() finds it done)
    except (ModelLoadError, VllmUnavailable, ValueError) as exc:
        print(f"pdbus {role}: {exc}", file=sys.stderr)
        return 2
    # Imported only now: vLLM's start-up rebinds kernels across every loaded module and trips over
    # some (numba's llvmlite, which the KV codec may load), so the engine starts first.
    from nodes.colocated_node import node_works
    return run_node(settings, lambda kv_thread: node_works(role, settings, engine, kv_thread))


def _reserve_kv(engine: Engine, role: str) -> None:
    """The decode side's KV memory, before the node serves; logged with what it took."""
    started = time.monotonic()
    engine.reserve_kv_memory()
    usage = engine.kv_usage()
    get_logger("node", role=role).info("kv_memory_reserved", mib=round(usage.num_slot_cache_bytes / 2**20, 1),
                                       seconds=round(time.monotonic() - started, 2),
                                       preallocate_kv=engine.config.preallocate_kv)
