"""STREAMS through the sans-I/O broker: one message carrying the next PARTIAL of many streams.

Contract: a base of `bus.broker_routes.RouteTable` sharing its tables (`routes`) and output.
`on_streams(node, command, frames, now)` handles one STREAMS from a serving node:
- fast path (every entry of a well-behaved node's message): each request id has a route served
  by the sender whose client is registered, and all entries share that client. The message is
  forwarded to it whole and untouched (zero copy); the broker reads only the index frame's shape
  and ids (seqs and bodies are the client's to check, as for a PARTIAL). Each entry counts as
  one reply of its route.
- otherwise (a route gone, a client not back after a broker restart, entries for several
  clients): the message is split into one PARTIAL per entry and each takes the PARTIAL path
  (`on_reply`): forwarded, held for a returning client, or dropped as `unknown_request`.
- an index or bodies frame that does not parse is un-scoped bad input (`reject`): the sender is
  disconnected as for any malformed message (docs/PROTOCOL.md §1.7).
This is what makes the broker's cost grow with engine steps, not tokens: one route check per
entry (a dict lookup) and one send per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import codec
from bus.broker_tables import Node, Route
from bus.codec import HEADERS, ProtocolError
from bus.constants import Command, DropReason
from bus.stream_index import stream_index, stream_index_shape

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable

_PARTIAL = HEADERS[Command.PARTIAL]


class StreamRoutes:
    routes: dict[bytes, Route]
    outbox: list[list]
    metrics: Counter[str]
    on_reply: Callable[[Node, Command, list, float], None]
    reject: Callable[[bytes, ProtocolError, list], None]

    def on_streams(self, node: Node, command: Command, frames: list, now: float) -> None:
        try:
            index = stream_index_shape(frames[1])
        except ProtocolError as exc:
            self.reject(node.identity, exc, frames)
            return
        routes = self.routes
        first = routes.get(index[0]) if type(index[0]) is bytes else None
        client = first.client if first is not None else None
        served = []
        for request_id in index[::2]:
            route = routes.get(request_id) if type(request_id) is bytes else None
            if route is None or route.server is not node or route.client is not client or client is None:
                self._split(node, frames, now)
                return
            served.append(route)
        for route in served:
            route.num_replies += 1
        assert client is not None   # every entry's route has it
        client.timers.last_sent = now
        self.outbox.append([client.identity, *frames])
        self.metrics["routed.streams"] += 1
        self.metrics["routed.stream_entries"] += len(served)

    def _split(self, node: Node, frames: list, now: float) -> None:
        try:
            index = stream_index(frames[1])   # every id and seq checked: each becomes a PARTIAL
            bodies = codec.unpack(frames[2])
            if type(bodies) is not list or 2 * len(bodies) != len(index):
                raise ProtocolError(DropReason.MALFORMED, "STREAMS bodies must be a list, one per index entry")
            partials = [[_PARTIAL, request_id, codec.encode_seq(seq), codec.pack(body)]
                         for request_id, seq, body in zip(index[::2], index[1::2], bodies, strict=True)]
        except ProtocolError as exc:
            self.reject(node.identity, exc, frames)
            return
        self.metrics["streams.split"] += 1
        for partial in partials:
            self.on_reply(node, Command.PARTIAL, partial, now)
