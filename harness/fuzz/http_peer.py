"""Gateway senders: raw HTTP/1.1 requests and WebSocket sessions with generated content, and the
one well-formed streaming request the fuzz run ends with.

Contract:
- `await http_send(host, port, raw, counts, timeout)`: writes the bytes on a fresh TCP connection,
  reads the answer for at most `timeout` and closes (a client that goes away mid-stream is part of
  the hostility). Counts `sent.http.<kind>` and `seen.http.<status>` (`seen.http.none` when no
  status line came: the gateway closed, or is still streaming).
- `await ws_send(url, messages, counts, timeout)`: a `/v1/stream` WebSocket that sends each text
  (str) or binary (bytes) message, reads what comes back for at most `timeout`, and closes.
  Counts `sent.ws.<text|binary>`, `seen.ws.<type>` per answer and `seen.ws.refused` when the
  handshake itself failed.
- `await complete(url, max_tokens=8, timeout=60) -> dict`: OpenAI SSE streaming completion;
  `{"ok", "status", "num_chunks", "text", "finish_reason", "error", "seconds"}`; ok means HTTP 200,
  at least one token, a finish reason and `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx

from harness.fuzz.bus_peer import Counts
from harness.fuzz.strategies import MODEL_NAME


async def http_send(host: str, port: int, kind: str, raw: bytes, counts: Counts, timeout: float = 2.0) -> None:
    counts[f"sent.http.{kind.split()[0] or 'empty'}"] += 1
    status = "none"
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(raw)
            await writer.drain()
            line = await reader.readline()
            parts = line.split()
            status = parts[1].decode(errors="replace") if len(parts) > 1 else "none"
    except (TimeoutError, OSError):
        pass
    finally:
        counts[f"seen.http.{status}"] += 1
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


async def ws_send(url: str, messages: list[str | bytes], counts: Counts, timeout: float = 3.0) -> None:
    import websockets

    try:
        async with asyncio.timeout(timeout), websockets.connect(url, max_size=None, open_timeout=timeout) as ws:
            for message in messages:
                counts[f"sent.ws.{'binary' if isinstance(message, bytes) else 'text'}"] += 1
                await ws.send(message)
            async for answer in ws:
                counts[f"seen.ws.{_ws_type(answer)}"] += 1
    except TimeoutError:
        pass
    except Exception as exc:   # ConnectionClosed*, InvalidStatus, OSError: the gateway said no
        name = type(exc).__name__
        counts[f"seen.ws.{'refused' if 'Invalid' in name or isinstance(exc, OSError) else 'closed'}"] += 1


def _ws_type(answer: str | bytes) -> str:
    try:
        return str(json.loads(answer).get("type"))[:16]
    except (ValueError, AttributeError):
        return "undecodable"


async def warm_extras(url: str, timeout: float = 60.0) -> list[int]:
    """Serve one request of each feature that loads a library on first use (the grammar library:
    ~50 MiB once, in the gateway and the nodes), so the RSS baseline holds it and growth means a
    leak. Returns the HTTP statuses."""
    bodies = [("/v1/completions", {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "n": 2, "logprobs": 1,
                                   "response_format": {"type": "json_object"}}),
              ("/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user",
                                                                                            "content": "hi"}],
                                        "tool_choice": "required", "tools": [{"type": "function", "function": {
                                            "name": "f", "parameters": {"type": "object"}}}]}),
              ("/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 2, "guided_regex": "[a-z]{2}"})]
    # What the library refuses, and a schema it panics on: their paths allocate on first use too.
    refused: list[dict[str, Any]] = [{"guided_regex": "(("}, {"response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"required": "\u00e9" * 80}}}}]
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout)) as http:
        statuses = [(await http.post(path, json=body)).status_code for path, body in bodies]
        for extra in refused:
            await http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", **extra})
    return statuses


async def complete(url: str, max_tokens: int = 8, timeout: float = 60.0, prompt: str = "Hello, world") -> dict[str, Any]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    result: dict[str, Any] = {"ok": False, "status": None, "num_chunks": 0, "text": "", "finish_reason": None,
                              "error": None}
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout)) as http, \
                asyncio.timeout(timeout), http.stream("POST", "/v1/completions", json=body) as response:
            result["status"] = response.status_code
            if response.status_code != 200:
                result["error"] = (await response.aread())[:300].decode(errors="replace")
            else:
                await _read_sse(response, result)
    except (httpx.HTTPError, TimeoutError, ValueError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


async def _read_sse(response: httpx.Response, result: dict[str, Any]) -> None:
    async for line in response.aiter_lines():
        if line == "data: [DONE]":
            result["ok"] = result["num_chunks"] > 0 and result["finish_reason"] is not None and not result["error"]
            return
        if not line.startswith("data: "):
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            result["error"] = chunk["error"]
            continue
        for choice in chunk.get("choices", []):
            if choice.get("text"):
                result["num_chunks"] += 1
                result["text"] += choice["text"]
            result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
    result["error"] = result["error"] or "the stream ended without [DONE]"
