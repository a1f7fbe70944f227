"""A hostile node inside a registered session: it answers the REQUESTs the broker routes to it the
way a compromised or broken prefill or decode node could.

Contract: `await serve(session, sampler, known, kv_peers, counts)` runs until cancelled, taking
each REQUEST from `session.requests` and drawing a plan for it (`plans`):
- `forge` (a prefill REQUEST naming a decode node's KV endpoint the run knows): a consistent,
  checksummed raw KV transfer for the decode request, of the exact shape the decode node expects,
  holding NaN / infinities / huge values (`kv_peer.forge`); then the DIRECT `kv_ready` to the decode
  node with a drawn `first_token_id` (in or out of the vocabulary, negative, huge, not a number);
  then a token PARTIAL and a done FINAL to the client. Counted `forged.<DONE ok|refused|none>`.
- `replies`: `strategies.replies` (PARTIAL / FINAL / ERROR with mutated bodies: plans naming
  hostile data endpoints, tokens out of range, usage of the wrong types; seqs in order or not);
- `silent`: no answer at all (the client's timers and the broker's route table must cope).
The request ids it serves go into `known.request_ids`, so other senders forge around live routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import strategies as st

from bus import codec
from bus.constants import Command
from bus.messages import Request
from harness.fuzz import forged_frames
from harness.fuzz import strategies as s
from harness.fuzz.bus_peer import Counts, Session, reply_frames
from harness.fuzz.kv_peer import KvPeer
from harness.fuzz.sampler import Sampler


def plans(role: str) -> st.SearchStrategy[tuple[str, Any, bytes, list]]:
    actions = ["forge", "forge", "replies", "silent"] if role == "prefill" else ["replies", "replies", "silent"]
    return st.tuples(st.sampled_from(actions), s.first_token_ids, st.sampled_from(s.FILLS), s.replies(role))


def remember(known: forged_frames.Known, request_id: str, limit: int = 256) -> None:
    known.request_ids.append(request_id)
    del known.request_ids[:-limit]


async def serve(session: Session, sampler: Sampler, known: forged_frames.Known, kv_peers: dict[str, KvPeer],
                counts: Counts) -> None:
    pending: list = []
    while True:
        request = await session.requests.get()
        remember(known, request.request_id)
        if not pending:
            pending = await sampler.adraw(plans(session.ready.role), 16)
        action, first_token_id, fill, replies = pending.pop() if pending else ("silent", 0, b"", [])
        counts[f"plan.{session.ready.role}.{action}"] += 1
        body = request.body if isinstance(request.body, dict) else {}
        if action == "forge" and body.get("data_endpoint") in kv_peers:
            await forge(session, request, body, kv_peers[body["data_endpoint"]], known, fill, first_token_id, counts)
        elif action != "silent":
            await answer(session, request.request_id, replies)


async def answer(session: Session, request_id: str, replies: list[tuple[Command, int | None, bytes]]) -> None:
    for seq, (command, drawn_seq, body) in enumerate(replies):
        await session.send(f"{command.name}.reply", reply_frames(command, request_id, seq if drawn_seq is None
                                                                 else drawn_seq, body))


async def forge(session: Session, request: Request, body: dict, kv: KvPeer, known: forged_frames.Known, fill: bytes,
                first_token_id: Any, counts: Counts) -> None:
    prompt = body.get("prompt_token_ids")
    ids = [i for i in (body.get(k) for k in ("transfer_id", "request_id", "decode_node_id"))
           if isinstance(i, str) and i]
    if not (isinstance(prompt, list) and prompt and len(ids) == 3):
        return
    transfer_id, decode_request_id, decode_node_id = ids
    layers, heads, dim = known.geometry
    ok = await kv.forge(transfer_id, decode_request_id, (layers, 2, heads, len(prompt), dim), fill)
    counts[f"forged.{'none' if ok is None else 'ok' if ok else 'refused'}"] += 1
    ready = {"type": "kv_ready", "request_id": decode_request_id, "transfer_id": transfer_id,
             "first_token_id": first_token_id}
    await session.send("DIRECT.kv_ready", [codec.HEADERS[Command.DIRECT], decode_node_id.encode(), forged_frames.pack(ready)])
    token = first_token_id if isinstance(first_token_id, int) else 0
    await session.send("PARTIAL.reply", reply_frames(Command.PARTIAL, request.request_id, 0, forged_frames.pack(
        {"type": "token", "index": 0, "token_id": token, "text": "?"})))
    await session.send("FINAL.reply", reply_frames(Command.FINAL, request.request_id, 1, forged_frames.pack(
        {"type": "done", "node_id": session.node_id, "token": [0, token, "?"], "transfer": {"transfer_id": transfer_id},
         "timings": {}, "stats": {}})))
    await asyncio.sleep(0)
