"""The serving half of `bus.endpoint_core.EndpointCore`: reply streams, DIRECTs, and the window
of sent replies that is replayed after a broker loss.

Contract: a base of `EndpointCore`, sharing its tables (`serving`: request id -> next seq,
`clients`: request id -> the client's node id, `sent_replies`) and output. `reply` queues the
next PARTIAL or the FINAL of one stream; `reply_batch` the next PARTIAL of several streams, as
one STREAMS message per client (a plain PARTIAL when a client has one entry, at most
`MAX_STREAM_ENTRIES` entries a message), so an engine step costs the broker one message per
client, not one per token; `reply_error` ends a stream with ERROR; `direct` sends a DIRECT.
A reply whose body cannot be encoded becomes ERROR `internal` for its own request only. Every
one of them is kept for `expiry + interval` in `sent_replies` (see EndpointCore's contract).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from bus import codec
from bus import constants as c
from bus.codec import ProtocolError
from bus.liveness import HeartbeatConfig
from bus.messages import Direct, Error, Final, Partial, Streams


class ServingReplies:
    serving: dict[str, int]
    clients: dict[str, str]
    sent_replies: deque[tuple[float, str | None, list]]
    heartbeat: HeartbeatConfig
    registered: bool
    metrics: Counter[str]

    def send_app(self, frames: list, now: float, request_id: str | None = None) -> None:
        raise NotImplementedError   # EndpointCore's

    def reply(self, request_id: str, body: Any, payload: tuple, final: bool, now: float) -> bool:
        """Queue the next PARTIAL (or the FINAL); False if the request is not ours any more."""
        seq = self.serving.get(request_id)
        if seq is None:
            self.metrics["dropped.reply_to_unknown_request"] += 1
            return False
        try:
            frames = codec.encode((Final if final else Partial)(request_id, seq, body, payload))
        except ProtocolError as exc:   # node code's bug: the client gets an ERROR, not silence
            self.metrics["failed.unencodable_reply"] += 1
            return self.reply_error(request_id, c.ErrorCode.INTERNAL, f"reply not encodable: {exc.detail}", {}, now)
        if final:
            del self.serving[request_id]
            self.clients.pop(request_id, None)
        else:
            self.serving[request_id] = seq + 1
        self.send_replayable(request_id, frames, now)
        return True

    def reply_batch(self, items: Sequence[tuple[str, Any]], now: float) -> None:
        """The next PARTIAL of each `(request_id, body)`, one STREAMS message per client (a plain
        PARTIAL when a client has one entry). Requests no longer ours are skipped and counted; an
        unencodable body is sent alone, so only its own request gets the ERROR."""
        by_client: dict[str, list[Partial]] = {}
        for request_id, body in items:
            seq = self.serving.get(request_id)
            if seq is None:
                self.metrics["dropped.reply_to_unknown_request"] += 1
                continue
            self.serving[request_id] = seq + 1
            by_client.setdefault(self.clients.get(request_id, ""), []).append(Partial(request_id, seq, body))
        for entries in by_client.values():
            for chunk in (entries[i:i + c.MAX_STREAM_ENTRIES] for i in range(0, len(entries), c.MAX_STREAM_ENTRIES)):
                self._send_partials(chunk, now)

    def _send_partials(self, entries: list[Partial], now: float) -> None:
        try:
            frames = codec.encode(Streams(tuple(entries)) if len(entries) > 1 else entries[0])
        except ProtocolError:
            if len(entries) == 1:   # node code's bug: the client gets an ERROR, not silence
                self.metrics["failed.unencodable_reply"] += 1
                self.reply_error(entries[0].request_id, c.ErrorCode.INTERNAL, "reply not encodable", {}, now)
                return
            for entry in entries:
                self._send_partials([entry], now)
            return
        self.metrics["sent.streams" if len(entries) > 1 else "sent.partial"] += 1
        self.send_replayable(entries[0].request_id if len(entries) == 1 else None, frames, now)

    def reply_error(self, request_id: str, code: str, message: str, details: Mapping, now: float) -> bool:
        self.clients.pop(request_id, None)
        if self.serving.pop(request_id, None) is None:
            self.metrics["dropped.reply_to_unknown_request"] += 1
            return False
        self.send_replayable(request_id, codec.encode(Error(request_id, code, message, dict(details))), now)
        return True

    def direct(self, message: Direct, now: float) -> None:
        self.direct_encoded(codec.encode(message), now)

    def direct_encoded(self, frames: list, now: float) -> None:
        # Kept in the replay window like a reply: a DIRECT the old broker never forwarded (a
        # prefill node's kv_ready) goes out again after re-registering; receivers ignore copies.
        self.send_replayable(None, frames, now)

    def send_replayable(self, request_id: str | None, frames: list, now: float) -> None:
        """Send (or backlog) a reply or DIRECT, keeping it in the window replayed after a broker loss."""
        if self.registered:   # the backlog keeps the rest until it is sent
            window = self.sent_replies
            while window and window[0][0] < now - self.heartbeat.expiry_s - self.heartbeat.interval_s:
                window.popleft()
            window.append((now, request_id, frames))
        self.send_app(frames, now)

