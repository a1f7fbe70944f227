"""KV data-plane sender: hostile traffic at a decode node's KV endpoint (its ROUTER, docs/PROTOCOL.md
part 2), as a prefill node's DEALER would connect to it (plain mode, no CURVE).

Contract:
- `KvPeer(context, endpoint, counts)`: one DEALER to the endpoint; `start()` begins reading the
  receiver's replies in the background (counted as `seen.kv.<ACK|NACK|DONE|undecodable>`; DONEs
  are remembered per transfer id); `await send(kind, frames)`; `await close()`.
- `await forge(transfer_id, request_id, shape, fill) -> bool | None`: sends a whole forged transfer
  (forged_frames.forged_transfer: consistent, checksummed, holding `fill`) and waits for its DONE
  (ok, or None when none came within the timeout).
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio

from bus.kv import frames as kvf
from harness.fuzz.bus_peer import Counts, new_dealer, send
from harness.fuzz.forged_frames import forged_transfer

KINDS = {kvf.ACK: "ACK", kvf.NACK: "NACK", kvf.DONE: "DONE"}


class KvPeer:
    def __init__(self, context: zmq.asyncio.Context, endpoint: str, counts: Counts) -> None:
        self.endpoint, self.counts = endpoint, counts
        self.socket = new_dealer(context, endpoint)
        self.done: dict[str, bool] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> KvPeer:
        self._task = asyncio.create_task(self._read())
        return self

    async def send(self, kind: str, frames: list[bytes]) -> bool:
        return await send(self.socket, frames, self.counts, f"kv.{kind}")

    async def _read(self) -> None:
        while True:
            frames = await self.socket.recv_multipart()
            try:
                message = kvf.decode_header(frames[0])
            except kvf.KVFrameError:
                self.counts["seen.kv.undecodable"] += 1
                continue
            self.counts[f"seen.kv.{type(message).__name__.upper()}"] += 1
            if isinstance(message, kvf.Done):
                self.done[message.transfer_id] = message.ok
                while len(self.done) > 4096:
                    self.done.pop(next(iter(self.done)))

    async def forge(self, transfer_id: str, request_id: str, shape: tuple[int, int, int, int, int],
                    fill: bytes, timeout: float = 3.0) -> bool | None:
        for frames in forged_transfer(transfer_id, request_id, shape, fill):
            await self.send("forged_transfer", frames)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while transfer_id not in self.done:
                    await asyncio.sleep(0.01)
        return self.done.get(transfer_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, zmq.ZMQError):
                await self._task
        self.socket.close(linger=0)
