"""The main of an engine node process, shared by `pdbus prefill`, `pdbus decode` and
`pdbus node --role both`: settings -> engine -> `run_node` with the role's works.

Contract: `serve_role(args, role) -> int` (exit code; 2 with one line on stderr when the model or
the settings are unusable, the KV budget included: a decode side reserves its memory here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bus.log import get_logger
from nodes.engines.base import Engine
from nodes.node_settings import NodeSettings


def serve_role(args: argparse.Namespace, role: str) -> int:
    prefer_passive_openmp()   # before torch is imported
    from nodes.engines.model_loader import ModelLoadError
    from nodes.engines.vllm_args import VllmUnavailable
    from nodes.node_settings import node_settings
    from nodes.runtime import run_node

    settings = node_settings(args, role)
    try:
        engine = build_engine(settings)
        if role != "prefill" or settings.switchable:
            _reserve_kv(engine, role)   # here, to fail with one line (DecodeWork.prepare() finds it done)
    except (ModelLoadError, VllmUnavailable, ValueError) as exc:
        print(f"pdbus {role}: {exc}", file=sys.stderr)
        return 2
    # Imported only now: vLLM's start-up rebinds kernels across every loaded module and trips over
    # some (numba's llvmlite, which the KV codec may load), so the engine starts first.
    from nodes.colocated_node import node_works
    works_of = "switchable" if settings.switchable else role
    return run_node(settings, lambda kv_thread: node_works(works_of, settings, engine, kv_thread))


def _reserve_kv(engine: Engine, role: str) -> None:
    """The decode side's KV memory, before the node serves; logged with what it took."""
    started = time.monotonic()
    engine.reserve_kv_memory()
    usage = engine.kv_usage()
    get_logger("node", role=role).info("kv_memory_reserved", mib=round(usage.num_slot_cache_bytes / 2**20, 1),
                                       seconds=round(time.monotonic() - started, 2),
                                       preallocate_kv=engine.config.preallocate_kv)


def prefer_passive_openmp() -> None:
    """Two engine processes sharing cores must not spin-wait on each other (call before torch)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_engine(settings: NodeSettings) -> Engine:
    """Load the model and build the engine (torch threads are pinned by the engine)."""
    if settings.engine_kind == "vllm":
        from nodes.engines.model_loader import open_model_folder
        from nodes.engines.vllm_engine import VllmEngine

        folder = open_model_folder(settings.model, model_dir=settings.model_dir)
        return VllmEngine(folder, settings.engine_config(), role=settings.role)
    from nodes.engines.llama_engine import LlamaEngine
    from nodes.engines.model_loader import load_model

    config = settings.engine_config()
    model = load_model(settings.model, model_dir=settings.model_dir, device=config.device)
    return LlamaEngine(model, config)
