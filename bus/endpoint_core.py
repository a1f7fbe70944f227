"""A node's side of the control plane, sans I/O: registration, heartbeats, reconnect decisions,
reply sequence numbers and stream checking. Driven by `(frames, now)`; no sockets, no threads.

Contract for the shell (bus.endpoint):
- `on_socket_opened(now)` after connecting a fresh DEALER socket (queues READY);
  `on_frames(frames, now)` per message received; `tick(now) -> bool` every `tick_interval()`
  (shorter while the link carries work), True meaning "close the socket and open a new one now"
  (broker lost, or registration not acknowledged in time); then send everything `take_outbox()`
  returns and dispatch `take_events()`.
- Events: the received `Request`, `Direct`, `Control`, `Cancel` (for node code), `Partial`/`Final`/`Error`
  (for the reply stream of a request this node sent), and `LinkUp` / `LinkDown`. Which message
  becomes an event, and what it does to the stream tables, is `bus.endpoint_inbound`'s.
- App calls (`request`, `reply`, `reply_error`, `direct`, `control_encoded`, `cancel`,
  `update_capacity`, `change_role`) queue frames; while unregistered they wait in a bounded backlog that is flushed on registration.
  READY's `pending` names only requests that left the backlog (a new broker would otherwise make
  a placeholder route for a request it has not seen); a request pushed out of a full backlog
  ends its stream with ERROR `backlog_full`. A reply whose body cannot be encoded is sent as
  ERROR `internal` instead, so the client's stream still ends.
- `change_role(role, now)`: READY again, on the same link, in the new role (a node switching
  between prefill and decode; the broker keeps the requests it names, PROTOCOL.md §1.3).
- A `gateway` endpoint serves nothing: a REQUEST, DIRECT, CONTROL or un-scoped ERROR reaching it is
  dropped and counted (`dropped.not_served`), never queued for code that does not read it.
Liveness (6/PPP, improved): any message from the broker counts as life; HEARTBEAT only after an
idle interval; broker silent for interval*liveness -> LinkDown, new socket, READY again (with the
requests in flight), each new attempt after a jittered, doubling, capped back-off. A serving
node with no request it serves or awaits uses the idle interval for both (§1.4), as the broker
does for it.
Replies survive a broker restart: the replies we sent (PARTIAL, FINAL, ERROR) and our DIRECTs
stay in a short `sent_replies` window; at LinkDown those sent from one heartbeat interval before we last heard
from the broker on are kept, and after the next registration they go out again before the
backlog (READY.inflight names their requests, so the broker routes them). A broker that died
with them queued, or a new broker that refused them before we re-registered, loses nothing;
the client's stream drops the copies it already has (sequence numbers); a DIRECT's receiver must
treat a copy as a no-op (the broker holds a DIRECT for a peer not yet back, bus.broker_directs).
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus import codec
from bus import constants as c
from bus.backlog import Backlog
from bus.codec import ProtocolError
from bus.endpoint_inbound import InboundHandlers
from bus.endpoint_replies import ServingReplies
from bus.liveness import Backoff, HeartbeatConfig, LinkTimers
from bus.messages import (
    Cancel,
    CapacityUpdate,
    Disconnect,
    Error,
    Heartbeat,
    Ready,
    Request,
)


@dataclass(frozen=True, slots=True)
class LinkUp:
    """The broker acknowledged our READY."""


@dataclass(frozen=True, slots=True)
class LinkDown:
    reason: str   # "expired" (broker silent) or the DISCONNECT reason it sent


class EndpointCore(ServingReplies, InboundHandlers):
    def __init__(self, role: str, node_id: str, capacity: Mapping[str, float] | None = None,
                 data_endpoint: str = "", heartbeat: HeartbeatConfig | None = None,
                 rng: random.Random | None = None, max_backlog: int = 100_000) -> None:
        if role not in c.ROLES:
            raise ValueError(f"role must be one of {c.ROLES}, got {role!r}")
        self.role, self.node_id, self.data_endpoint = role, node_id, data_endpoint
        self.capacity = dict(capacity or {})
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.backoff = Backoff(self.heartbeat.interval_s, self.heartbeat.backoff_cap_s, rng)
        self.timers = LinkTimers(last_seen=0.0, last_sent=0.0)
        self.registered = False
        self.retry_at = 0.0
        self.serving: dict[str, int] = {}    # request id -> next seq of our reply stream
        self.clients: dict[str, str] = {}    # request id we serve -> its client's node id
        self.streams: dict[str, int] = {}    # request id we sent -> next seq we expect
        self.backlog = Backlog(max_backlog)
        self.sent_replies: deque[tuple[float, str | None, list]] = deque()   # (sent at, request id or None for a DIRECT, frames)
        self.replay: list[tuple[str | None, list]] = []   # replies (and DIRECTs: None) to send again
        self.outbox: list[list] = []
        self.events: list[Any] = []
        self.metrics: Counter[str] = Counter()

    # -- link ----------------------------------------------------------------------------

    def on_socket_opened(self, now: float) -> None:
        self.registered = False
        self.timers = LinkTimers(last_seen=now, last_sent=now)
        # Hold this socket at least one liveness window: libzmq keeps re-dialling underneath
        # and delivers the queued READY the moment a broker appears.
        self.retry_at = now + max(self.heartbeat.expiry_s, self.backoff.next_delay())
        self.metrics["link.attempts"] += 1
        self.send_now(codec.encode(self.ready_message()), now)

    def ready_message(self) -> Ready:
        inflight = dict.fromkeys([*self.serving, *(request_id for request_id, _ in self.replay if request_id)])
        return Ready(role=self.role, node_id=self.node_id, capacity=dict(self.capacity),
                     data_endpoint=self.data_endpoint, inflight=tuple(inflight),
                     pending=tuple(r for r in self.streams if not self.backlog.holds_request(r)))

    def tick(self, now: float) -> bool:
        """Run the timers; True asks the shell for a fresh socket (then `on_socket_opened`)."""
        if not self.registered:
            return now >= self.retry_at
        self.timers.engage(self.engaged, now)
        if self.timers.is_expired(now, self.heartbeat):
            self._link_down("expired", self.timers.last_seen)
            return True
        if self.timers.heartbeat_due(now, self.heartbeat):
            self.send_now(codec.encode(Heartbeat()), now)
        return False

    @property
    def engaged(self) -> bool:
        """§1.4: a serving node's link heartbeats at the idle interval while it serves and awaits
        no request (and holds no reply to send again); a gateway's or controller's never does."""
        return self.role not in c.SERVING_ROLES or bool(self.serving or self.streams or self.replay)

    def tick_interval(self) -> float:
        """How soon the shell should run `tick` again: every interval / 5 while the link is not
        registered or carries work, every idle interval / 5 while it is idle."""
        if not self.registered or self.engaged:
            return self.heartbeat.tick_s
        return self.heartbeat.idle_interval_s / 5

    def close(self, now: float) -> None:
        """Say goodbye (the shell flushes, then closes the socket)."""
        if self.registered:
            self.send_now(codec.encode(Disconnect(c.DisconnectReason.SHUTDOWN, "node stopping")), now)
        self.registered = False

    def _link_down(self, reason: str, last_heard: float) -> None:
        self.registered = False
        self.metrics["link.lost"] += 1
        self.events.append(LinkDown(reason))
        # What the broker had not yet forwarded when it went may be lost: anything sent from
        # about one interval (messages in flight) before we last heard from it.
        since = last_heard - self.heartbeat.interval_s
        self.replay += [(request_id, frames) for sent_at, request_id, frames in self.sent_replies if sent_at >= since]
        self.sent_replies.clear()

    def _link_up(self) -> None:
        self.registered = True
        self.backoff.reset()
        self.metrics["link.registered"] += 1
        self.metrics["replies.replayed"] += len(self.replay)
        self.events.append(LinkUp())
        self.outbox.extend(frames for _, frames in self.replay)
        self.replay.clear()
        self.outbox.extend(self.backlog.take_all())

    # -- input ---------------------------------------------------------------------------

    def on_frames(self, frames: list, now: float) -> None:
        last_heard, self.timers.last_seen = self.timers.last_seen, now
        try:
            message = codec.decode(frames)
        except ProtocolError as exc:
            self._on_bad_input(exc)
            return
        if isinstance(message, Disconnect):
            self._on_disconnect(message, now, last_heard)
            return
        if not self.registered:
            self._link_up()
        self._on_message(message)

    def _on_bad_input(self, exc: ProtocolError) -> None:
        self.metrics[f"dropped.{exc.reason}"] += 1
        if exc.request_id is not None and self.streams.pop(exc.request_id, None) is not None:
            self.events.append(Error(exc.request_id, exc.reason, f"unreadable reply: {exc.detail}"))

    def _on_disconnect(self, message: Disconnect, now: float, last_heard: float) -> None:
        # The broker forgot us (restart, expiry after a freeze) or refuses us: register again,
        # on a fresh socket, after the back-off.
        self.metrics[f"disconnect.{message.reason}"] += 1
        if self.registered:
            self._link_down(message.reason, last_heard)
        # First retry at once (the usual case: a restarted broker); repeated refusals back off.
        delay = 0.0 if self.backoff.num_attempts == 0 else self.backoff.next_delay()
        self.retry_at = min(self.retry_at, now + delay)

    # -- app calls -----------------------------------------------------------------------

    def request(self, message: Request, now: float) -> None:
        self.request_encoded(message.request_id, codec.encode(message), now)

    def request_encoded(self, request_id: str, frames: list, now: float) -> None:
        """`request` with the frames encoded by the caller (so an unencodable request fails there)."""
        self.streams[request_id] = 0
        self.send_app(frames, now, request_id)

    def cancel(self, request_id: str, now: float) -> None:
        if self.streams.pop(request_id, None) is None or self.backlog.withdraw(request_id):
            return   # not ours, or it never left: taken back, no CANCEL needed
        self.send_app(codec.encode(Cancel(request_id, c.CancelReason.CLIENT)), now)

    def control_encoded(self, frames: list, now: float) -> None:
        # Not replayed after a broker loss: a controller decides again on fresh stats.
        self.send_app(frames, now)

    def change_role(self, role: str, now: float) -> None:
        if role not in c.ROLES:
            raise ValueError(f"role must be one of {c.ROLES}, got {role!r}")
        self.role = role
        if self.registered:   # otherwise the next READY carries it
            self.send_now(codec.encode(self.ready_message()), now)

    def update_capacity(self, capacity: Mapping[str, float], now: float) -> None:
        self.capacity = dict(capacity)
        if self.registered:   # otherwise the next READY carries it
            self.send_now(codec.encode(CapacityUpdate(self.capacity)), now)

    # -- output --------------------------------------------------------------------------

    def send_now(self, frames: list, now: float) -> None:
        self.timers.last_sent = now
        self.outbox.append(frames)

    def send_app(self, frames: list, now: float, request_id: str | None = None) -> None:
        if self.registered:
            self.send_now(frames, now)
            return
        before = self.backlog.num_dropped
        dropped = self.backlog.push(frames, request_id)
        self.metrics["dropped.backlog_full"] += self.backlog.num_dropped - before
        if dropped is not None and self.streams.pop(dropped, None) is not None:
            self.events.append(Error(dropped, c.ErrorCode.BACKLOG_FULL,
                                     "the request waited for the broker while the backlog overflowed"))

    def take_outbox(self) -> list[list]:
        outbox, self.outbox = self.outbox, []
        return outbox

    def take_events(self) -> list[Any]:
        events, self.events = self.events, []
        return events

