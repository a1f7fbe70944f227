"""What a registered node's endpoint does with each decoded message from the broker, sans I/O: a
base of `bus.endpoint_core.EndpointCore`, sharing its tables and its `events`.

Contract: `_on_message(message)` takes one decoded message other than DISCONNECT (the core's
link logic handles that, and bad input) and updates the core's tables:
- REQUEST, DIRECT, CONTROL reach node code (`events`) on a serving node only; anywhere else they
  are dropped and counted (`dropped.not_served`). A REQUEST starts a served stream (`serving`:
  request id -> next seq; `clients`: request id -> the client's node id).
- CANCEL ends a served stream and reaches node code only if the stream was still served.
- PARTIAL, FINAL, ERROR (and each entry of a STREAMS) belong to a stream this node awaits
  (`streams`: request id -> next seq): duplicates are dropped (`dropped.duplicate`), gaps counted
  (`stream.gaps`), FINAL or ERROR ends the stream. An ERROR for no awaited stream reaches a
  serving node's code when it is un-scoped (about a DIRECT) or ends a served stream (a reply the
  broker refused); any other reply is dropped (`dropped.unknown_request`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from bus import constants as c
from bus.messages import Cancel, Control, Direct, Error, Final, Partial, Request, Streams


class InboundHandlers:
    role: str
    serving: dict[str, int]
    clients: dict[str, str]
    streams: dict[str, int]
    events: list[Any]
    metrics: Counter[str]

    def _on_message(self, message: Any) -> None:
        handler = _HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message)

    def _on_request(self, message: Request) -> None:
        if self.role not in c.SERVING_ROLES:
            self.metrics["dropped.not_served"] += 1
            return
        self.serving[message.request_id] = 0
        self.clients[message.request_id] = message.peer
        self.events.append(message)

    def _on_direct(self, message: Direct) -> None:
        if self.role not in c.SERVING_ROLES:
            self.metrics["dropped.not_served"] += 1
            return
        self.events.append(message)

    def _on_control(self, message: Control) -> None:
        if self.role not in c.SERVING_ROLES:
            self.metrics["dropped.not_served"] += 1
            return
        self.events.append(message)

    def _on_cancel(self, message: Cancel) -> None:
        self.clients.pop(message.request_id, None)
        if self.serving.pop(message.request_id, None) is not None:
            self.events.append(message)

    def _on_reply(self, message: Partial | Final | Error) -> None:
        expected = self.streams.get(message.request_id)
        if expected is None:
            if isinstance(message, Error) and self.role in c.SERVING_ROLES and (
                    not message.request_id or self._stop_serving(message.request_id)):
                # Not tied to a stream of ours: about a DIRECT (unknown_node) or about a reply
                # we sent that the broker refused; node code gets it with the requests.
                self.events.append(message)
                return
            self.metrics["dropped.unknown_request"] += 1
            return
        if isinstance(message, Error):
            del self.streams[message.request_id]
            self.events.append(message)
            return
        if message.seq < expected:
            self.metrics["dropped.duplicate"] += 1
            return
        if message.seq > expected:
            self.metrics["stream.gaps"] += message.seq - expected
        self.streams[message.request_id] = message.seq + 1
        if isinstance(message, Final):
            del self.streams[message.request_id]
        self.events.append(message)

    def _stop_serving(self, request_id: str) -> bool:
        self.clients.pop(request_id, None)
        return self.serving.pop(request_id, None) is not None

    def _on_streams(self, message: Streams) -> None:
        for entry in message.entries:
            self._on_reply(entry)


_HANDLERS: dict[type, Callable[[InboundHandlers, Any], None]] = {
    Request: InboundHandlers._on_request, Cancel: InboundHandlers._on_cancel,
    Direct: InboundHandlers._on_direct, Control: InboundHandlers._on_control,
    Partial: InboundHandlers._on_reply, Final: InboundHandlers._on_reply, Error: InboundHandlers._on_reply,
    Streams: InboundHandlers._on_streams,
}
