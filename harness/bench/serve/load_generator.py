"""The load generator: sends a workload to an OpenAI-compatible `/v1/completions` endpoint over
SSE and records each request's timeline, as `vllm bench serve --backend openai` does.

Contract:
- `await run_load(url, model, specs, offsets=..., max_concurrency=..., on_done=...)`
  -> (list[RequestResult], duration_s): request i is sent at `offsets[i]` seconds after the start
  (Poisson arrivals), and not before request `specs[i].after` ended (a conversation's next turn),
  at most `max_concurrency` in flight (None = unbounded; with all offsets 0 this is
  fixed-concurrency load). `duration_s` runs from the first send to the last completion.
- Timeline per request (monotonic clock): `ttft` = first chunk carrying text; `itl` = gaps
  between later text chunks; `latency` = until `[DONE]`; `output_tokens` = the server's
  `usage.completion_tokens` (asked with `stream_options.include_usage`), else the text chunks.
  The body is vLLM's (`ignore_eos`, greedy, `max_tokens` = the spec's output length).
- A failed request (HTTP status, an error chunk, a dropped connection) has `success=False` and its
  `error`; it never raises. `pdbus` is the final chunk's `pdbus` object (stage timings), if any;
  `phase` is the spec's (the phased workload's tag).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from harness.bench.serve.serve_workload import RequestSpec

TIMEOUT = aiohttp.ClientTimeout(total=6 * 3600)


@dataclass(slots=True)
class RequestResult:
    kind: str
    prompt_len: int
    output_len: int                 # asked for
    success: bool = False
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start_time: float = 0.0         # since the load started
    error: str = ""
    pdbus: dict | None = None
    phase: str = ""                 # the spec's phase (phased workload)


def request_body(model: str, spec: RequestSpec) -> dict:
    body = {"model": model, "prompt": list(spec.prompt_token_ids), "max_tokens": spec.output_len,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    return body | {"session_id": spec.session_id} if spec.session_id else body


def apply_chunk(result: RequestResult, chunk: dict, sent_at: float, now: float, state: dict) -> None:
    """Fold one SSE `data:` object into the result (sans-I/O: `now` is the arrival time)."""
    if "error" in chunk:
        result.error = str(chunk["error"].get("message", chunk["error"]))
        return
    if chunk.get("pdbus"):
        result.pdbus = chunk["pdbus"]
    if chunk.get("usage"):
        result.output_tokens = int(chunk["usage"].get("completion_tokens", 0))
    choices = chunk.get("choices") or []
    if not choices or not choices[0].get("text"):
        return
    if "last" not in state:
        result.ttft = now - sent_at
    else:
        result.itl.append(now - state["last"])
    state["last"] = now
    state["num_chunks"] = state.get("num_chunks", 0) + 1


async def send_one(session: aiohttp.ClientSession, url: str, model: str, spec: RequestSpec,
                   result: RequestResult) -> RequestResult:
    state: dict = {}
    sent_at = time.perf_counter()
    try:
        async with session.post(f"{url}/v1/completions", json=request_body(model, spec)) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                apply_chunk(result, json.loads(payload), sent_at, time.perf_counter(), state)
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - sent_at
    result.output_tokens = result.output_tokens or state.get("num_chunks", 0)
    result.success = not result.error and "last" in state
    if not result.success and not result.error:
        result.error = "no tokens"
    return result


async def run_load(url: str, model: str, specs: Sequence[RequestSpec], *, offsets: Sequence[float] | None = None,
                   max_concurrency: int | None = None,
                   on_done: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float]:
    offsets = list(offsets) if offsets is not None else [0.0] * len(specs)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as session:
        started = time.perf_counter()
        ended = [asyncio.Event() for _ in specs]

        async def one(index: int, spec: RequestSpec, offset: float) -> RequestResult:
            try:
                return await send_after(spec, offset)
            finally:
                ended[index].set()

        async def send_after(spec: RequestSpec, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
            if 0 <= spec.after < len(specs):
                await ended[spec.after].wait()
            result = RequestResult(spec.kind, spec.prompt_len, spec.output_len, phase=spec.phase)
            if limit is not None:
                async with limit:
                    result.start_time = time.perf_counter() - started
                    await send_one(session, url, model, spec, result)
            else:
                result.start_time = time.perf_counter() - started
                await send_one(session, url, model, spec, result)
            if on_done is not None:
                on_done(result)
            return result

        results = await asyncio.gather(*(one(i, s, o) for i, (s, o) in enumerate(zip(specs, offsets, strict=True))))
        return list(results), time.perf_counter() - started
