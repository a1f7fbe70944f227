"""The `hostile-peer` scenario's process: a peer that speaks garbage and forgeries at the broker
and at the decode nodes' KV endpoints while the chaos workload streams (only the harness runs it).

Contract: `python -m harness.chaos.hostile --broker EP --kv EP... --node ID... --ids FILE
--summary FILE [--seed N] [--seconds MAX] [--rate MSGS_PER_S]` runs until SIGTERM or `--seconds`,
then writes its counts (`sent.*`, `seen.*`, `forged.live.*`) as JSON to `--summary` and exits 0.
`--ids` is a JSON file `{"request_ids": [...], "transfer_ids": [...]}` of live ids that the scenario
keeps filling from the nodes' logs; it is re-read every round. Each round, paced at `--rate`:
- from a fresh unregistered DEALER: mutated control messages (harness.fuzz.strategies.control);
- from inside two registered sessions, a `gateway` and a `decode` node whose capacity always says
  `full` (the scheduler never routes to it): mutated control messages, and forgeries aimed at
  live requests it does not serve: PARTIAL / FINAL / ERROR / CANCEL for their request ids, and a
  DIRECT `kv_ready` to every real decode node naming a live request with a wrong transfer id and a
  drawn first_token_id (the broker must drop the replies and cancels; the decode node must ignore
  a kv_ready for a transfer it never received);
- at every KV endpoint: garbage, headers with mutated fields under valid xxh3 trailers, forged
  checksummed chunks, and CHUNK / END / ABORT naming live transfers from a peer that is not their
  sender.
Left out on purpose (`harmless`): what plain mode lets any peer do by design and CURVE exists to
stop: registering a node that serves (`prefill`/`decode`/`both` READY), reporting a capacity that
attracts work, REQUESTs to the real services (they would run on the cluster's two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
import uuid
from pathlib import Path

import zmq.asyncio

from bus import codec
from bus.codec import ProtocolError
from bus.constants import Command
from bus.messages import Ready
from harness.fuzz import forged_frames
from harness.fuzz import strategies as s
from harness.fuzz.bus_peer import Counts, Session, garbage_burst, reply_frames
from harness.fuzz.kv_peer import KvPeer
from harness.fuzz.sampler import Sampler

FULL = {"kv_blocks_total": 1, "kv_blocks_free": 0, "max_running": 1, "full": 1}
SERVING = {"prefill", "decode", "both"}
LIVE_PER_ROUND = 4


def harmless(kind: str, frames: list[bytes], registered: bool) -> bool:
    """False for what plain mode admits by design (see the module docstring), True for the rest."""
    if kind == "READY":
        try:
            ready = codec.decode(frames)
        except ProtocolError:
            return True
        return not (isinstance(ready, Ready) and (registered or ready.role in SERVING))
    if kind == "REQUEST":
        return len(frames) < 2 or bytes(frames[1]) not in {r.encode() for r in SERVING}
    return not (registered and kind == "CAPACITY")


def read_ids(path: str, known: forged_frames.Known) -> None:
    try:
        ids = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return
    known.request_ids[:] = [i for i in ids.get("request_ids", []) if isinstance(i, str)][-64:]
    known.transfer_ids[:] = [i for i in ids.get("transfer_ids", []) if isinstance(i, str)][-64:]


class Hostile:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.counts = args, Counts()
        self.known = forged_frames.Known(node_ids=list(args.node), data_endpoints=list(args.kv), geometry=forged_frames.tiny_geometry())
        self.sampler = Sampler(args.seed)
        self.control, self.kv = s.control(self.known), s.kv(self.known)
        self.sent_at = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        context = zmq.asyncio.Context()
        broker = self.args.broker
        sessions = [Session(context, broker, "gateway", "hostile-gateway", self.counts),
                    Session(context, broker, "decode", "hostile-decode", self.counts, capacity=FULL)]
        peers = [KvPeer(context, endpoint, self.counts).start() for endpoint in self.args.kv]
        try:
            for session in sessions:
                await session.start()
            while not stop.is_set():
                read_ids(self.args.ids, self.known)
                await self.round(sessions, peers)
        finally:
            for session in sessions:
                await session.close()
            for peer in peers:
                await peer.close()
            context.destroy(linger=0)

    async def pace(self) -> None:
        self.sent_at = max(self.sent_at + 1 / self.args.rate, time.monotonic() - 1.0)
        await asyncio.sleep(max(0.0, self.sent_at - time.monotonic()))

    async def round(self, sessions: list[Session], peers: list[KvPeer]) -> None:
        garbage = [m for m in await self.sampler.adraw(self.control, 16) if harmless(*m, registered=False)]
        await garbage_burst(sessions[0].context, self.args.broker, garbage, self.counts)
        for session in sessions:
            for kind, frames in await self.sampler.adraw(self.control, 16):
                if harmless(kind, frames, registered=True):
                    await session.send(kind, frames)
                    await self.pace()
            await self.forge_replies(session)
        for kind, frames in await self.sampler.adraw(self.kv, 16):
            for peer in peers:
                await peer.send(kind, frames)
            await self.pace()
        await self.forge_kv(peers)

    async def forge_replies(self, session: Session) -> None:
        first_tokens = await self.sampler.adraw(s.first_token_ids, LIVE_PER_ROUND)
        bodies = await self.sampler.adraw(s.body(s.reply_body), 3)
        for request_id, first_token in zip(self.known.request_ids[-LIVE_PER_ROUND:], first_tokens, strict=False):
            for node_id in self.known.node_ids:
                ready = {"type": "kv_ready", "request_id": request_id, "transfer_id": uuid.uuid4().hex,
                         "first_token_id": first_token}
                await self.live(session, "DIRECT", [codec.HEADERS[Command.DIRECT], node_id.encode(), forged_frames.pack(ready)])
            replies = zip((Command.PARTIAL, Command.FINAL, Command.ERROR), bodies, strict=False)
            for seq, (command, body) in enumerate(replies):
                await self.live(session, command.name, reply_frames(command, request_id, seq, body))
            await self.live(session, "CANCEL", [codec.HEADERS[Command.CANCEL], request_id.encode(),
                                                forged_frames.pack({"reason": "client"})])

    async def live(self, session: Session, kind: str, frames: list[bytes]) -> None:
        if await session.send(f"{kind}.live", frames):
            self.counts[f"forged.live.{kind}"] += 1
        await self.pace()

    async def forge_kv(self, peers: list[KvPeer]) -> None:
        layers, heads, dim = self.known.geometry
        pairs = zip(self.known.transfer_ids[-LIVE_PER_ROUND:], self.known.request_ids[-LIVE_PER_ROUND:], strict=False)
        for transfer_id, request_id in pairs:
            forged = forged_frames.forged_transfer(transfer_id, request_id, (layers, 2, heads, 4, dim), b"\x00\x00\xc0\x7f")
            messages = {"CHUNK": forged[0], "END": forged[-1], "ABORT": [forged_frames.kv_header(3, [transfer_id, "forged"])]}
            for peer in peers:
                for kind, message in messages.items():
                    if await peer.send(f"{kind}.live", message):
                        self.counts[f"forged.live.KV_{kind}"] += 1
                    await self.pace()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.chaos.hostile")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--kv", action="append", default=[], help="a decode node's KV endpoint (repeatable)")
    parser.add_argument("--node", action="append", default=[], help="a real decode node id (repeatable)")
    parser.add_argument("--ids", required=True, help="JSON file of live request and transfer ids")
    parser.add_argument("--summary", required=True, help="where to write the counts (JSON)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=120.0, help="the longest it runs")
    parser.add_argument("--rate", type=float, default=300.0, help="messages per second at most")
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace) -> Counts:
    hostile, stop = Hostile(args), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.call_later(args.seconds, stop.set)
    await hostile.run(stop)
    return hostile.counts


def main(argv: list[str]) -> int:
    args = parse(argv)
    counts = asyncio.run(amain(args))
    Path(args.summary).write_text(json.dumps(dict(counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
