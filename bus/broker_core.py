"""The broker's protocol logic, sans I/O: frames and the time in, frames and events out.

Contract:
- `on_frames(identity, frames, now)`: one message received on the ROUTER socket (identity
  stripped). `tick(now)`: run the timers (expire silent nodes, heartbeat idle links, fail
  requests orphaned by a restart). `shutdown(now)`: DISCONNECT everyone.
- A dead process closes its TCP connection at once; the broker need not wait for its silence.
  `on_connection_closed(now)` (the shell's socket monitor saw a connection close; it cannot
  say whose) probes every node with a HEARTBEAT now and at each tick for one interval;
  `peer_gone(identity, now)` (a send found that peer's connection gone: EHOSTUNREACH) gives
  the node one heartbeat interval to register again from a new connection (a live node
  reconnects within libzmq's 100 ms and keeps its requests), then it leaves as
  `connection_lost`: a killed node is declared dead in about a third of the liveness window.
  A frozen or cut-off node keeps its connection and is still judged by its silence: a serving
  node with work by the short window (counted from when the work began), an idle one by the
  idle window (`HeartbeatConfig.idle_interval_s`, PROTOCOL.md §1.4).
- Registration (READY, HEARTBEAT, DISCONNECT, CAPACITY; a node's join and leave) is
  `bus.broker_registry`'s; routing is `bus.broker_routes`'s.
- Results accumulate in `outbox` (lists `[identity, *frames]` to send as they are) and `events`
  (`bus.broker_tables` events for logs and listeners); the shell takes them with `take_outbox()` /
  `take_events()`. `metrics` counts routed and dropped messages and joins/leaves.
- A policy may defer a REQUEST (`bus.routing.Defer`): it waits in a bounded queue per service
  and is offered again on every join, CAPACITY and tick (see `bus.broker_routes`).
- Routed messages (REQUEST, PARTIAL, FINAL, ERROR, DIRECT, CANCEL) are forwarded on their
  header and routing frames only; body and payload frames pass through untouched (zero copy).
  CONTROL (rare, small) is decoded and checked first, and passes only from a `control` peer.
- `authorize(header_frame, role) -> reason | None` and `identify(header_frame) -> owner | None`
  (optional, from the shell: CURVE keys -> roles, and the sender's key): a READY for a role the
  sender may not take, or for a node id bound to another key, is dropped (`dropped.forbidden`)
  and answered with DISCONNECT `forbidden`; nothing of the sender is registered
  (`bus.broker_admission`).
- Never raises on peer input: bad input is dropped, counted under `dropped.<reason>` and
  answered with an ERROR (request-scoped) or a DISCONNECT; everyone else keeps being served.
  A handler or policy that fails anyway is contained: the message is counted
  (`failed.handler`), a request gets ERROR `internal`, and the broker goes on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container
from typing import Any

from bus import codec
from bus import constants as c
from bus.broker_admission import Admission
from bus.broker_registry import HEARTBEAT_FRAMES, NodeRegistry
from bus.broker_routes import RouteTable
from bus.broker_tables import BrokerEvent, Node, PeerRejected
from bus.codec import ProtocolError
from bus.constants import Command, DisconnectReason, DropReason, LeaveReason
from bus.liveness import HeartbeatConfig
from bus.messages import Disconnect, Error, Message
from bus.routing import LeastOutstandingPolicy, RoutingPolicy

# Where the request id sits in each request-scoped command, for request-scoped error replies.
_REQUEST_ID_FRAME = {Command.REQUEST: 2, Command.PARTIAL: 1, Command.FINAL: 1, Command.ERROR: 1,
                     Command.CANCEL: 1}


class BrokerCore(RouteTable, NodeRegistry):
    def __init__(self, heartbeat: HeartbeatConfig | None = None, policy: RoutingPolicy | None = None,
                 max_message_bytes: int = c.DEFAULT_MAX_MESSAGE_BYTES,
                 orphan_grace_s: float | None = None,
                 authorize: Callable[[Any, str], str | None] | None = None,
                 identify: Callable[[Any], str | None] | None = None) -> None:
        self.admission = Admission(authorize, identify)
        self.heartbeat = heartbeat or HeartbeatConfig()
        self.policy: RoutingPolicy = policy or LeastOutstandingPolicy()
        self.max_message_bytes = max_message_bytes
        self.nodes_by_identity: dict[bytes, Node] = {}
        self.nodes_by_id: dict[str, Node] = {}
        self.outbox: list[list] = []
        self.events: list[BrokerEvent] = []
        self.metrics: Counter[str] = Counter()
        self.now = 0.0   # time of the input being handled, for paths that send without a `now`
        self.probe_until = 0.0   # after a connection closed: probe every node until then
        # Nodes re-register within about one liveness window of a broker restart; give the
        # other end of a re-announced request two windows before declaring it lost.
        RouteTable.__init__(self, orphan_grace_s if orphan_grace_s is not None else 2 * self.heartbeat.expiry_s)
        self._handlers = {
            Command.READY: self._on_ready, Command.HEARTBEAT: self._on_heartbeat,
            Command.DISCONNECT: self._on_disconnect, Command.CAPACITY: self._on_capacity,
            Command.REQUEST: self.on_request, Command.PARTIAL: self.on_reply,
            Command.FINAL: self.on_reply, Command.ERROR: self.on_reply,
            Command.DIRECT: self.on_direct, Command.CANCEL: self.on_cancel,
            Command.STREAMS: self.on_streams, Command.ADOPT: self.on_adopt,
            Command.CONTROL: self.on_control,
        }

    # -- input ---------------------------------------------------------------------------

    def on_frames(self, identity: bytes, frames: list, now: float) -> None:
        self.now = now
        try:
            command = self._validate(frames)
        except ProtocolError as exc:
            self.reject(identity, exc, frames)
            return
        try:
            self._handle(identity, command, frames, now)
        except Exception as exc:   # a bug, not bad input: contain it to this one message
            self.contain_failure(identity, command, frames, exc)

    def _handle(self, identity: bytes, command: Command, frames: list, now: float) -> None:
        node = self.nodes_by_identity.get(identity)
        if node is None:
            self._on_unregistered(identity, command, frames, now)
            return
        node.timers.last_seen = now
        self._handlers[command](node, command, frames, now)

    def contain_failure(self, identity: bytes, command: Command | None, frames: list, exc: Exception) -> None:
        """A handler raised: count and report it; a request gets ERROR `internal` (its route,
        if one was made, is kept consistent by `finish`)."""
        self.metrics["failed.handler"] += 1
        node = self.nodes_by_identity.get(identity)
        self.events.append(PeerRejected("internal_error", f"{type(exc).__name__} handling {command!r}",
                                        node.node_id if node else None, identity))
        if command is Command.REQUEST:
            request_id = codec.raw_bytes(frames[2])
            route = self.routes.get(request_id)
            if route is not None and route.client is node and route.server is None:
                self.finish(route)
            self.send_error(identity, request_id.decode(errors="replace"), c.ErrorCode.INTERNAL,
                            "the broker failed on this request")

    def _validate(self, frames: list) -> Command:
        if not frames:
            raise ProtocolError(DropReason.MALFORMED, "empty message")
        command = codec.parse_header(frames[0])
        codec.check_frames(command, len(frames))
        if sum(map(len, frames)) > self.max_message_bytes:
            index = _REQUEST_ID_FRAME.get(command)
            request_id = bytes(frames[index]).decode(errors="replace") if index else None
            raise ProtocolError(DropReason.OVERSIZED, f"message over {self.max_message_bytes} bytes",
                                request_id)
        return command

    def _on_unregistered(self, identity: bytes, command: Command, frames: list, now: float) -> None:
        if command is Command.READY:
            self._on_ready(None, command, frames, now, identity)
        elif command is not Command.DISCONNECT:
            # 7/MDP: anything but READY from an unknown peer gets DISCONNECT, which makes a node
            # that outlived a broker restart register again at once.
            self.reject(identity, ProtocolError(DropReason.NOT_REGISTERED, "send READY first"), frames)

    # -- timers --------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Expire silent nodes, heartbeat idle links, fail orphaned requests."""
        try:
            self._run_timers(now)
        except Exception as exc:   # contained like a handler's failure; the next tick runs again
            self.metrics["failed.tick"] += 1
            self.events.append(PeerRejected("internal_error", f"{type(exc).__name__} in tick", None, b""))

    def _run_timers(self, now: float) -> None:
        self.now = now
        config = self.heartbeat
        probing = now < self.probe_until
        queued_by = {entry.client for entry in self.queue.by_id.values()} if self.queue.by_id else ()
        for node in list(self.nodes_by_identity.values()):
            node.timers.engage(self._engaged(node, queued_by), now)
            if node.timers.is_expired(now, config):
                self._forget(node, LeaveReason.EXPIRED, now)
            elif node.connection_lost_at is not None and now - node.connection_lost_at >= config.interval_s:
                self._forget(node, LeaveReason.CONNECTION_LOST, now)
            elif probing or node.timers.heartbeat_due(now, config):
                self.send(node, list(HEARTBEAT_FRAMES), now)
        self.expire_orphans(now)
        if self.held_directs:
            self.expire_directs(now)
        if self.queue.by_id:
            # Capacity also frees without a CAPACITY report (streams end): retry every tick.
            self.dispatch_queued(now)
            self.expire_queued(now)

    @staticmethod
    def _engaged(node: Node, queued_by: Container[Node]) -> bool:
        """A link carries work (PROTOCOL.md §1.4): a serving node's link with no request it serves
        or awaits, and none of its requests queued here, heartbeats at the idle interval.
        Gateways and controllers keep the short one (they are few; clients' failover needs it)."""
        return (node.role not in c.SERVING_ROLES or bool(node.serving) or bool(node.waiting)
                or node in queued_by)

    def shutdown(self, now: float) -> None:
        for node in list(self.nodes_by_identity.values()):
            self.send(node, codec.encode(Disconnect(DisconnectReason.SHUTDOWN, "broker stopping")), now)

    # -- output --------------------------------------------------------------------------

    def send(self, node: Node, frames: list, now: float) -> None:
        node.timers.last_sent = now
        self.outbox.append([node.identity, *frames])

    def send_error(self, identity: bytes, request_id: str, code: str, message: str, **details) -> None:
        self.outbox.append([identity, *codec.encode(Error(request_id, code, message, details))])

    def reject(self, identity: bytes, exc: ProtocolError, frames: list) -> None:
        self.metrics[f"dropped.{exc.reason}"] += 1
        node = self.nodes_by_identity.get(identity)
        self.events.append(PeerRejected(exc.reason, exc.detail, node.node_id if node else None, identity))
        if exc.request_id is not None:
            self.fail_rejected_request(identity, node, exc, exc.request_id)
            return
        self.outbox.append([identity, *codec.encode(Disconnect(exc.reason, exc.detail))])
        if node is not None:
            self._forget(node, LeaveReason.PROTOCOL_ERROR, self.now)

    def decoded(self, identity: bytes, frames: list) -> Message | None:
        """The message `frames` hold, or None once the sender is rejected for them (`reject`)."""
        try:
            return codec.decode(frames)
        except ProtocolError as exc:
            self.reject(identity, exc, frames)
            return None

    def take_outbox(self) -> list[list]:
        outbox, self.outbox = self.outbox, []
        return outbox

    def take_events(self) -> list[BrokerEvent]:
        events, self.events = self.events, []
        return events

    def unroutable(self, identity: bytes) -> None:
        """The shell could not deliver to `identity` (socket gone or queue full)."""
        self.metrics[f"dropped.{DropReason.UNROUTABLE}"] += 1

    def on_connection_closed(self, now: float) -> None:
        """Some peer's connection closed: find out whose by probing everyone (see the contract)."""
        self.metrics["connections.closed"] += 1
        probing = now < self.probe_until
        self.probe_until = now + self.heartbeat.interval_s
        if probing:   # every tick probes already: under churn, no burst to every node per close
            return
        for node in list(self.nodes_by_identity.values()):
            self.send(node, list(HEARTBEAT_FRAMES), now)

    def peer_gone(self, identity: bytes, now: float) -> None:
        """A send to `identity` found no connection (not merely a full queue)."""
        node = self.nodes_by_identity.get(identity)
        if node is not None and node.connection_lost_at is None:
            node.connection_lost_at = now
            self.metrics["nodes.connection_lost"] += 1
