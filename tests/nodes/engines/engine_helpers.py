"""Helpers shared by the engine tests (not fixtures: plain functions).

`make_engine` builds engines on `$PDBUS_TEST_DEVICE` (default "cpu"): `PDBUS_TEST_DEVICE=cuda pytest
tests/nodes/engines` runs the engine tests that use it on a GPU (harness/device/cuda_checks.sh).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from bus.kv import RawPieces
from bus.kv.layout import ChunkSpec, KVInfo, as_planes, plan_chunks
from bus.kv.quant import NumpyQuantizer
from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams, TokenEvent
from nodes.engines.forward_batch import ForwardBatch, PrefillSpan
from nodes.engines.llama import LlamaRunner
from nodes.engines.llama_engine import LlamaEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def make_engine(model, **settings) -> LlamaEngine:
    settings.setdefault("dtype", "float32")
    settings.setdefault("device", engine_device())
    return LlamaEngine(model, EngineConfig(**settings))


def engine_device() -> str:
    return os.environ.get("PDBUS_TEST_DEVICE", "cpu")


def raw_pieces(kv: torch.Tensor, chunk_bytes: int) -> RawPieces:
    """`kv` as a raw transfer's receiver keeps it: one payload per chunk of the sender's plan."""
    from nodes.engines.kv_quant import TorchQuantizer
    info = TorchQuantizer().kv_info(kv)
    values = kv.view(torch.int16).numpy() if kv.dtype == torch.bfloat16 else kv.numpy()
    pieces = RawPieces(info)
    for spec in plan_chunks(info, chunk_bytes):
        pieces.keep(spec, np.ascontiguousarray(as_planes(values, info)[spec.planes, spec.tokens]).view(np.uint8).reshape(-1))
    return pieces


def drain(engine: LlamaEngine, max_steps: int = 10_000) -> dict[str, list[TokenEvent]]:
    """Step until idle; every request's events in order."""
    events: dict[str, list[TokenEvent]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return events
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
    raise AssertionError("engine did not finish")


def tokens_of(events: list[TokenEvent]) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


def generate(engine: LlamaEngine, prompt, sampling=GREEDY, request_id="r") -> list[int]:
    assert engine.add_request(DecodeRequest(request_id, tuple(prompt), sampling)).ok
    return tokens_of(drain(engine)[request_id])


def record_logits(engine: LlamaEngine) -> dict[str, list[torch.Tensor]]:
    """From now on, every sampled row's logits, per request, in step order."""
    seen: dict[str, list[torch.Tensor]] = {}
    engine.on_logits = lambda ids, logits: [seen.setdefault(r, []).append(x) for r, x in zip(ids, logits, strict=True)]
    return seen


def run_arrivals(engine: LlamaEngine, prompts, arrivals: dict[int, list[int]], sampling=GREEDY,
                 samplings: dict[int, SamplingParams] | None = None) -> dict[str, list[int]]:
    """Request i (id str(i), prompts[i]) joins at the step `arrivals` lists it under, with
    `samplings[i]` where given, else `sampling`; steps until all are done: each request's tokens."""
    events: dict[str, list[TokenEvent]] = {}
    last_arrival = max(arrivals)
    for step in range(2000):
        for i in arrivals.get(step, []):
            params = (samplings or {}).get(i, sampling)
            assert engine.add_request(DecodeRequest(str(i), prompts[i], params)).ok
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
        if step >= last_arrival and not engine.has_unfinished():
            return {rid: tokens_of(e) for rid, e in events.items()}
    raise AssertionError("engine did not finish")


def full_logits(runner: LlamaRunner, token_ids: list[int]) -> torch.Tensor:
    """Logits of every position by one uncached forward pass (the reference)."""
    n = len(token_ids)
    device = runner.device
    batch = ForwardBatch(torch.tensor(token_ids, device=device), torch.arange(n, device=device),
                         torch.arange(n, device=device), spans=[PrefillSpan(0, n, 0, runner.new_kv(n))])
    return runner.forward(batch)


def reference_greedy(runner: LlamaRunner, prompt, num_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding by recomputing the whole sequence every step (no KV cache at all)."""
    tokens, steps = list(prompt), []
    for _ in range(num_tokens):
        logits = full_logits(runner, tokens)[-1]
        steps.append(logits)
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):], steps


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float values -> bf16 bit patterns (uint16), truncated (kernels read bits, not roundings)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def widened(bits_: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> their exact values, float64."""
    return (bits_.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reference_encode(rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray, str]:
    """The numpy reference's int8 payload of `rows` (R, D): (codes, params, scale_dtype)."""
    info = KVInfo((1, 2, 1, rows.shape[0] // 2, rows.shape[1]), {v: k for k, v in DTYPES.items()}[rows.dtype])
    source = rows.view(torch.int16).numpy().view(np.uint16) if rows.dtype == torch.bfloat16 else rows.numpy()
    spec = ChunkSpec(0, 0, 2, 0, rows.shape[0] // 2)
    outs = [np.empty(rows.numel(), np.uint8), np.empty(rows.shape[0] * 8, np.uint8)]
    payload = NumpyQuantizer().encode(source.reshape(info.shape), info, spec, "int8", outs)
    return np.array(payload.frames[0]), np.array(payload.frames[1]), payload.scale_dtype
