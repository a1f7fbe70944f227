"""A stand-in for `BusClient` under a real `ClusterClient`, with scripted decode and prefill nodes
that may be hostile: real `ReplyStream`s, no broker.

Routing: a `decode` REQUEST keyed by its session goes to `home` (the node holding the session), one
with any other key (or none) to `spare`; `prefill` REQUESTs go to `prefills` in turn, the last one
taking the rest. A node is `async node(bus, put, body, request_id)`; `put` delivers a reply.

The healthy nodes produce a deterministic continuation: the token at stream position p of a prompt
of n tokens is `first_id(n + p)`, whichever node produces it, so a request resumed anywhere must
end with exactly the tokens of an undisturbed one (`expected(prompt, max_tokens)`).
`good_decode(plan)` plans `local` (prefills itself) or `remote` (waits for a good prefill's
`kv_ready`, kept in `bus.kv_ready`); `good_prefill` sends token 0, marks the KV ready, then its
FINAL. `bus.open` holds the streams not yet ended or cancelled: empty once a request is over.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from bus.mailbox import ReplyStream
from bus.messages import Final, Partial
from tests.nodes.gateway.fake_bus import OpenStreams

Node = Callable[..., Any]


def first_id(position: int) -> int:
    return 100 + position


def expected(prompt: list[int], max_tokens: int) -> list[int]:
    return [first_id(len(prompt) + i) for i in range(max_tokens)]


def token(index: int, token_id: int) -> dict:
    return {"type": "token", "index": index, "token_id": token_id, "text": f"<{token_id}>"}


def remote_plan(node_id: str, request_id: str) -> dict:
    return {"type": "plan", "plan": "remote", "node_id": node_id, "data_endpoint": "tcp://127.0.0.1:9",
            "transfer_id": "t-" + request_id}


def decode_done(prompt: list[int], num_tokens: int, node_id: str = "decode-good") -> dict:
    tokens = [[i, first_id(len(prompt) + i), f"<{first_id(len(prompt) + i)}>"] for i in range(num_tokens)]
    return {"type": "done", "node_id": node_id, "finish_reason": "length", "tokens": tokens,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": num_tokens},
            "timings": {"kv_wait_s": 0.001, "decode_queue_s": 0.0, "decode_s": 0.01},
            "stats": {"kv_raw_bytes": 64, "kv_wire_bytes": 32, "node_imported_tokens": len(prompt)}}


def prefill_done(prompt: list[int], node_id: str = "prefill-good") -> dict:
    first = first_id(len(prompt))
    return {"type": "done", "node_id": node_id, "token": [0, first, f"<{first}>"],
            "transfer": {"transfer_id": "t", "mode": "raw", "compression": "none", "raw_bytes": 64,
                         "wire_bytes": 64, "retries": 0, "checksum_failures": 0, "resends": 0, "seconds": 0.01},
            "timings": {"queue_s": 0.0, "prefill_s": 0.01, "kv_transfer_s": 0.001}, "stats": {}}


def good_decode(plan: str = "local", node_id: str = "decode-good") -> Node:
    async def node(bus: ClusterBus, put: Callable, body: dict, rid: str) -> None:
        prompt, num_tokens = body["prompt_token_ids"], body["sampling"]["max_tokens"]
        start = 0
        if plan == "remote":
            put(Partial(rid, 0, remote_plan(node_id, rid)))
            await asyncio.wait_for(bus.kv_ready.setdefault(rid, asyncio.Event()).wait(), 5)
            start = 1
        else:
            put(Partial(rid, 0, {"type": "plan", "plan": "local", "node_id": node_id}))
        for index in range(start, num_tokens):
            await asyncio.sleep(0)
            put(Partial(rid, index + 1, token(index, first_id(len(prompt) + index))))
        put(Final(rid, num_tokens + 1, decode_done(prompt, num_tokens, node_id)))
    return node


async def good_prefill(bus: ClusterBus, put: Callable, body: dict, rid: str) -> None:
    prompt = body["prompt_token_ids"]
    put(Partial(rid, 0, token(0, first_id(len(prompt)))))
    bus.kv_ready.setdefault(body["request_id"], asyncio.Event()).set()
    put(Final(rid, 1, prefill_done(prompt)))


class ClusterBus(OpenStreams):
    def __init__(self, home: Node, spare: Node | None = None, prefills: tuple[Node, ...] = (good_prefill,)) -> None:
        super().__init__()
        self.home, self.spare, self.prefills = home, spare or home, list(prefills)
        self.sent: list[tuple[str, str, Any]] = []   # (service, key, body)
        self.kv_ready: dict[str, asyncio.Event] = {}

    def stream(self, service: str, body: Any = None, payload: tuple = (), *, key: str = "",
               request_id: str | None = None, timeout: float | None = None) -> ReplyStream:
        request_id = request_id or uuid.uuid4().hex
        stream = self.open[request_id] = ReplyStream(request_id, self._cancel, timeout)
        self.sent.append((service, key, body))
        if service == "decode":
            node = self.home if key == body["session_id"] else self.spare
        else:
            node = self.prefills.pop(0) if len(self.prefills) > 1 else self.prefills[0]
        self._spawn(node(self, lambda m: self._put(stream, m), body, request_id))
        return stream
