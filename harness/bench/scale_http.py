"""`make bench-scale`'s HTTP/SSE load client: `--streams` concurrent `/v1/completions` streams
through the real `pdbus gateway`, each reopened when it ends.

`python -m harness.bench.scale_http --url http://127.0.0.1:PORT --streams 256 --max-tokens 128`.
The same contract with the bench as harness/bench/scale_client.py (`ready`, the window on stdin,
`result`). The load generator stamps the send time into each token's text (`--stamp text`), the
gateway passes text through untouched, so a chunk's stamps (harness.loadgen.core.read_stamps)
time node send -> SSE chunk parsed here: the broker, the gateway's whole client path (cluster
client, generation, relay buffer, SSE encoding) and HTTP included. Chunks are read as vLLM's bench
reads them (one `data:` line each, JSON-decoded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import aiohttp
import uvloop

from harness.bench.scale_client import REFUSED_PAUSE_S, STALL_S, Tally, drive
from harness.bench.scale_procs import GATEWAY_MODEL_NAME
from harness.loadgen.core import read_stamps


class HttpLoad:
    def __init__(self, session: aiohttp.ClientSession, url: str, tally: Tally, max_tokens: int, seed: int) -> None:
        self.session, self.url, self.tally = session, f"{url}/v1/completions", tally
        self.random = random.Random(seed)
        self.low, self.high = max(1, max_tokens // 2), max(1, max_tokens * 3 // 2)

    def body(self) -> dict:
        return {"model": GATEWAY_MODEL_NAME, "prompt": [1, 2, 3], "stream": True, "ignore_eos": True,
                "temperature": 0.0, "max_tokens": self.random.randint(self.low, self.high)}

    async def consume(self) -> None:
        counters, first = self.tally.counters, True
        while True:
            try:
                async with self.session.post(self.url, json=self.body()) as response:
                    if response.status != 200:
                        counters[f"http.{response.status}"] += 1
                        await asyncio.sleep(REFUSED_PAUSE_S)
                        continue
                    async for raw in response.content:
                        if self._on_line(raw) and first:
                            first = False
                            self.tally.started()
                counters["finals"] += 1
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                counters[f"error.{type(exc).__name__}"] += 1
                await asyncio.sleep(REFUSED_PAUSE_S)

    def _on_line(self, raw: bytes) -> bool:
        """Tally one SSE line; True when it carried a token."""
        if not raw.startswith(b"data: {"):
            return False
        chunk = json.loads(raw[6:])
        if "error" in chunk:
            self.tally.counters[f"error.{chunk['error'].get('code', 'other')}"] += 1
            return False
        choices = chunk.get("choices") or ()
        stamps = read_stamps(choices[0].get("text") or "") if choices else []
        now = time.monotonic()
        for sent_at in stamps:
            self.tally.token(sent_at, now)
        return bool(stamps)


async def run(url: str, num_streams: int, max_tokens: int, seed: int, ready_timeout: float) -> None:
    tally = Tally(num_streams)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=STALL_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        load = HttpLoad(session, url, tally, max_tokens, seed)
        await drive(tally, [load.consume] * num_streams, ready_timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    uvloop.run(run(args.url, args.streams, args.max_tokens, args.seed, args.ready_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
