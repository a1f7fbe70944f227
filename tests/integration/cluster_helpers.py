"""Helpers shared by the cluster integration tests: reference outputs from one in-process
engine (the same model, fp32, greedy), prompts, and a client bound to a `ClusterProcs`."""

from __future__ import annotations

import torch

from harness.cluster_procs import poll_until
from nodes.cluster import ClusterClient
from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import build_tiny_model, load_model

PROMPTS = ["Hello world! How are you today?", "Once upon a time there was a little model",
           "The quick brown fox jumps over the lazy dog", "def main(): return 0 or for i in range(10)"]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def load(model: str):
    return build_tiny_model(seed=0, dtype=torch.float32) if model == "tiny" else load_model(model)


def reference(model, prompt: tuple[int, ...], sampling: SamplingParams) -> list[int]:
    """What one colocated engine generates for `prompt` (the fault-free output)."""
    engine = LlamaEngine(model, EngineConfig(dtype="float32", num_threads=1))
    assert engine.add_request(DecodeRequest("ref", prompt, sampling)).ok
    tokens = []
    while engine.has_unfinished():
        tokens += [e.token_id for e in engine.step() if e.token_id is not None]
    return tokens


def client_for(cluster, **options) -> ClusterClient:
    """An unstarted client (use it as a context manager)."""
    return ClusterClient(cluster.broker_endpoint, max_retries=options.pop("max_retries", 3),
                         stall_timeout_s=options.pop("stall_timeout_s", 30.0), **options)


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"{message} not reached within {timeout}s")
    return value
