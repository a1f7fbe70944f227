"""Which asyncio HTTP/WebSocket stack the gateway runs on: starlette + uvicorn (httptools, uvloop)
against aiohttp's server (uvloop), each serving the same three trivial endpoints in its own
process, driven by the same client in this process, side by side.

- `POST /json`: parse a small OpenAI-like JSON body, answer a small JSON (requests/s at 8 in
  flight; the per-request overhead of a non-streaming completion);
- `POST /sse`: stream 2000 SSE chunks of an OpenAI-sized `data:` line (chunks/s over 4 streams
  at once; the per-token overhead of streaming);
- `GET /ws`: a WebSocket that sends 2000 JSON messages (messages/s over 4 sockets at once).
The client is aiohttp for HTTP and `websockets` for WebSocket, the same for both servers, so the
ratio is the servers' cost. Rounds alternate the stacks; figures are the median over rounds.
Usage: flock /tmp/pdbus-bench.lock .venv/bin/python -m harness.bench.gateway_stack [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from harness.cluster_procs import free_port

NUM_CHUNKS = 2000
CHUNK = ("data: " + json.dumps({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
                               "choices": [{"index": 0, "text": " token", "logprobs": None,
                                            "finish_reason": None}]}) + "\n\n").encode()
REQUEST = {"model": "m", "prompt": "Hello there", "max_tokens": 16, "temperature": 0.0, "stream": False}
ANSWER = {"id": "cmpl-0", "object": "text_completion", "choices": [{"index": 0, "text": "hi"}]}


def starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route, WebSocketRoute

    async def json_endpoint(request):
        await request.json()
        return JSONResponse(ANSWER)

    async def sse_endpoint(request):
        async def chunks():
            for _ in range(NUM_CHUNKS):
                yield CHUNK
        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def ws_endpoint(websocket):
        await websocket.accept()
        for _ in range(NUM_CHUNKS):
            await websocket.send_text(CHUNK.decode())
        await websocket.close()

    return Starlette(routes=[Route("/json", json_endpoint, methods=["POST"]),
                             Route("/sse", sse_endpoint, methods=["POST"]), WebSocketRoute("/ws", ws_endpoint)])


def serve_starlette(port: int) -> None:
    import uvicorn
    uvicorn.run(starlette_app(), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                ws="websockets-sansio", log_level="warning", access_log=False)


def serve_aiohttp(port: int) -> None:
    import uvloop
    from aiohttp import web

    async def json_endpoint(request):
        await request.json()
        return web.json_response(ANSWER)

    async def sse_endpoint(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(NUM_CHUNKS):
            await response.write(CHUNK)
        await response.write_eof()
        return response

    async def ws_endpoint(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        for _ in range(NUM_CHUNKS):
            await ws.send_str(CHUNK.decode())
        await ws.close()
        return ws

    app = web.Application()
    app.add_routes([web.post("/json", json_endpoint), web.post("/sse", sse_endpoint), web.get("/ws", ws_endpoint)])
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _wait_up(base: str) -> None:
    import aiohttp
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.post(f"{base}/json", json=REQUEST) as response:
                    await response.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"server at {base} did not start")


async def json_rate(base: str, seconds: float = 2.0, in_flight: int = 8) -> float:
    import aiohttp
    done, deadline = 0, time.perf_counter() + seconds
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(f"{base}/json", json=REQUEST) as response:
                    await response.read()
                done += 1
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return done / (time.perf_counter() - start)


async def sse_rate(base: str, num_streams: int = 4) -> float:
    import aiohttp
    async with aiohttp.ClientSession() as session:
        async def one() -> int:
            count = 0
            async with session.post(f"{base}/sse", json=REQUEST) as response:
                async for line in response.content:
                    count += line.startswith(b"data:")
            return count
        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(num_streams)))
        assert all(c == NUM_CHUNKS for c in counts), counts
        return sum(counts) / (time.perf_counter() - start)


async def ws_rate(port: int, num_sockets: int = 4) -> float:
    import websockets

    async def one() -> int:
        count = 0
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
            async for _ in ws:
                count += 1
        return count
    start = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(num_sockets)))
    assert all(c == NUM_CHUNKS for c in counts), counts
    return sum(counts) / (time.perf_counter() - start)


async def measure(stack: str) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "harness.bench.gateway_stack", "--serve", stack,
                               "--port", str(port)], env={"OMP_NUM_THREADS": "1", "PATH": ""})
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait_up(base)
        return {"json_rps": await json_rate(base), "sse_chunks_s": await sse_rate(base),
                "ws_msgs_s": await ws_rate(port)}
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=["starlette", "aiohttp"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        (serve_starlette if args.serve == "starlette" else serve_aiohttp)(args.port)
        return
    stacks = ("starlette", "aiohttp")
    results: dict[str, list[dict[str, float]]] = {s: [] for s in stacks}
    for _ in range(args.rounds):
        for stack in stacks:
            results[stack].append(asyncio.run(measure(stack)))
    keys = ("json_rps", "sse_chunks_s", "ws_msgs_s")
    print(f"| stack | {' | '.join(keys)} |\n|---|" + "---:|" * len(keys))
    medians = {s: {k: statistics.median(r[k] for r in results[s]) for k in keys} for s in stacks}
    for stack in stacks:
        print(f"| {stack} | " + " | ".join(f"{medians[stack][k]:,.0f}" for k in keys) + " |")
    print("| ratio starlette/aiohttp | " + " | ".join(
        f"{medians['starlette'][k] / medians['aiohttp'][k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
