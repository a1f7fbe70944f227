"""Load drivers: stream one request and record what arrived, when, and what served it.

Contract: `driver = make_driver(kind, gateway_url=..., broker_endpoint=...)` with kind
- `sse`: OpenAI `POST /v1/completions` with `"stream": true` over httpx (the gateway's SSE chunks
  carry text only: streams are compared by text and token count, see `StreamRecord.token_ids`);
- `ws`: the gateway's `/v1/stream` WebSocket, whose token messages carry `token_id` (exact);
- `bus`: `ClusterClient` on the broker directly (exact token ids; no gateway in the path).
`await driver.run(spec, abort_after=None) -> StreamRecord`; `abort_after=k` closes the connection
after k tokens (a client that goes away; the consumer that stops reading is harness/chaos/stalled).
`await driver.open()` / `await driver.close()` around a pass. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from harness.chaos.chaos_workload import RequestSpec

MODEL_NAME = "SmolLM2-135M-Instruct"
REQUEST_TIMEOUT_S = 120.0


@dataclass
class StreamRecord:
    name: str
    started_at: float
    token_ids: list[int] | None = None        # None when the API gives only text (sse)
    texts: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)   # monotonic arrival of each chunk
    finished_at: float | None = None
    ok: bool = False
    error: str | None = None
    finish_reason: str | None = None
    num_completion_tokens: int | None = None
    decode_node: str | None = None            # known at once from the SSE header / bus trace
    pdbus: dict[str, Any] | None = None       # what served it (nodes, failovers, failures)
    aborted: bool = False                     # the driver went away on purpose
    stalled: bool = False

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def latency_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at

    def live_at(self, moment: float) -> bool:
        return self.started_at <= moment and (self.finished_at is None or self.finished_at >= moment)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "error": self.error, "finish_reason": self.finish_reason,
                "num_tokens": self.num_completion_tokens, "latency_s": self.latency_s, "aborted": self.aborted,
                "stalled": self.stalled, "decode_node": self.decode_node,
                "failures": (self.pdbus or {}).get("failures"), "decode_nodes": (self.pdbus or {}).get("decode_nodes")}


def new_record(driver: Any, spec: RequestSpec, exact: bool) -> StreamRecord:
    """A record for `spec`, visible at once to the pass's fault task (`driver.progress`)."""
    record = StreamRecord(spec.name, time.monotonic(), token_ids=[] if exact else None)
    if getattr(driver, "progress", None) is not None:
        driver.progress.records.append(record)
    return record


def request_body(spec: RequestSpec, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL_NAME, "prompt": list(spec.prompt_token_ids), "max_tokens": spec.max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True}}


class SseDriver:
    kind = "sse"

    def __init__(self, gateway_url: str) -> None:
        self.url = gateway_url
        self.http: httpx.AsyncClient | None = None

    async def open(self) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(REQUEST_TIMEOUT_S), limits=limits)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def run(self, spec: RequestSpec, abort_after: int | None = None) -> StreamRecord:
        record = new_record(self, spec, exact=False)
        try:
            assert self.http is not None, "open() the driver first"
            async with asyncio.timeout(REQUEST_TIMEOUT_S), \
                    self.http.stream("POST", "/v1/completions", json=request_body(spec)) as response:
                record.decode_node = response.headers.get("x-pdbus-decode-node")
                if response.status_code != 200:
                    record.error = f"http {response.status_code}: {(await response.aread())[:200]!r}"
                    return record
                await self._read(record, response, abort_after)
        except (httpx.HTTPError, TimeoutError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            record.finished_at = time.monotonic()
        return record

    async def _read(self, record: StreamRecord, response: httpx.Response, abort_after: int | None) -> None:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                record.ok = record.error is None and record.finish_reason is not None
                return
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record.error = f"stream error: {chunk['error'].get('code')} {chunk['error'].get('message')}"
                continue
            if "usage" in chunk and not chunk.get("choices"):
                record.num_completion_tokens = chunk["usage"]["completion_tokens"]
                continue
            choice = chunk["choices"][0]
            if choice.get("text"):
                record.texts.append(choice["text"])
                record.token_times.append(time.monotonic())
            if choice.get("finish_reason"):
                record.finish_reason, record.pdbus = choice["finish_reason"], chunk.get("pdbus")
            if abort_after is not None and len(record.token_times) >= abort_after:
                record.aborted = True
                return   # leaving the `stream` context closes the connection mid-stream
        record.error = record.error or "the stream ended without [DONE]"


class WsDriver:
    kind = "ws"

    def __init__(self, gateway_url: str) -> None:
        self.url = gateway_url.replace("http://", "ws://") + "/v1/stream"

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def run(self, spec: RequestSpec, abort_after: int | None = None) -> StreamRecord:
        import websockets

        record = new_record(self, spec, exact=True)
        token_ids = record.token_ids
        assert token_ids is not None   # an exact record
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S), websockets.connect(self.url, max_size=None) as ws:
                await ws.send(json.dumps(request_body(spec)))
                async for raw in ws:
                    message = json.loads(raw)
                    if message["type"] == "token":
                        token_ids.append(message["token_id"])
                        record.texts.append(message["text"])
                        record.token_times.append(time.monotonic())
                        if abort_after is not None and len(token_ids) >= abort_after:
                            record.aborted = True
                            return record
                    elif message["type"] == "done":
                        record.finish_reason, record.pdbus = message["finish_reason"], message.get("pdbus")
                        record.num_completion_tokens = message["usage"]["completion_tokens"]
                        record.ok = True
                        return record
                    else:
                        record.error = f"error: {message.get('error')}"
                        return record
                record.error = "the socket closed before done"
        except Exception as exc:   # OSError, TimeoutError, websockets' ConnectionClosed* and InvalidStatus
            record.error = record.error or f"{type(exc).__name__}: {exc}"
        finally:
            record.finished_at = time.monotonic()
        return record


class BusDriver:
    kind = "bus"

    def __init__(self, broker_endpoint: str, max_retries: int = 3) -> None:
        from nodes.cluster import ClusterClient

        self.client = ClusterClient(broker_endpoint, max_retries=max_retries, stall_timeout_s=30.0)

    async def open(self) -> None:
        await asyncio.to_thread(self.client.start)

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)

    async def run(self, spec: RequestSpec, abort_after: int | None = None) -> StreamRecord:
        from nodes.cluster import ClusterError
        from nodes.engines.base import SamplingParams
        from nodes.gateway.openai_format import pdbus_info

        record = new_record(self, spec, exact=True)
        token_ids = record.token_ids
        assert token_ids is not None   # an exact record
        sampling = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens, ignore_eos=True)
        generation = self.client.generate(spec.prompt_token_ids, sampling)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                async for token in generation:
                    node_ids = generation.trace.decode_node_ids
                    record.decode_node = record.decode_node or (node_ids[-1] if node_ids else None)
                    token_ids.append(token.token_id)
                    record.texts.append(token.text)
                    record.token_times.append(time.monotonic())
                    if abort_after is not None and len(token_ids) >= abort_after:
                        record.aborted = True
                        await generation.aclose()
                        return record
            result = generation.result
            assert result is not None   # set once the generation ended
            record.finish_reason, record.num_completion_tokens = result.finish_reason, len(result.token_ids)
            record.ok = True
        except ClusterError as exc:
            record.error = f"{exc.code}: {exc.message}"
        except TimeoutError:
            record.error = "timeout"
            await generation.aclose()
        finally:
            record.pdbus = pdbus_info(generation.trace, "")
            record.finished_at = time.monotonic()
        return record


def make_driver(kind: str, *, gateway_url: str | None = None, broker_endpoint: str | None = None) -> Any:
    if kind == "bus":
        if broker_endpoint is None:
            raise ValueError("the bus driver needs the broker endpoint")
        return BusDriver(broker_endpoint)
    if gateway_url is None:
        raise ValueError(f"the {kind} driver needs the gateway")
    return SseDriver(gateway_url) if kind == "sse" else WsDriver(gateway_url)
