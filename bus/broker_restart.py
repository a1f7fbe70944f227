"""Routes rebuilt after a broker restart: the half of the broker's routing that adopts the
requests re-registering nodes announce, holds replies for clients not back yet, and fails
what nobody claims.

Contract: a base of `bus.broker_routes.RouteTable` sharing its tables (`routes`, `orphans`,
`queue`) and output. `adopt_requests(new, ready, old, now)` on every READY: READY.inflight makes
the sender a route's server, READY.pending its client; a route with one end missing is an
orphan. Replies for an orphan whose client is not back are held (at most `MAX_HELD_REPLIES` a
route, `MAX_HELD_REPLY_BYTES` in all) and released when it re-registers; `expire_orphans(now)`
fails an orphan older than `orphan_grace_s` (ERROR `request_lost` / CANCEL `client_lost`).
`on_adopt` takes the same announcements from a registered node's ADOPT (requests it moved
here from a broker it lost: docs/PROTOCOL.md §1.12).
`is_placeholder_of(request_id, client)`: a route made from `client`'s READY pending alone, which
the REQUEST itself replaces when it arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import codec
from bus.broker_tables import BrokerEvent, Node, RequestsAdopted, Route
from bus.codec import ProtocolError, raw_bytes
from bus.constants import SERVING_ROLES, Command, DropReason, ErrorCode
from bus.messages import Adopt, Ready

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable

    from bus.broker_queue import DeferredQueue

MAX_HELD_REPLIES = 4096            # per route waiting for its client after a broker restart
MAX_HELD_REPLY_BYTES = 256 << 20   # over all such routes


class RestartRoutes:
    routes: dict[bytes, Route]
    orphans: dict[bytes, Route]
    orphan_grace_s: float
    held_reply_bytes: int
    queue: DeferredQueue
    outbox: list[list]
    metrics: Counter[str]
    send_error: Callable[..., None]
    finish: Callable[[Route], None]
    _cancel_server: Callable[[Route, float], None]
    events: list[BrokerEvent]
    reject: Callable[[bytes, ProtocolError, list], None]

    def is_placeholder_of(self, request_id: bytes, node: Node) -> bool:
        route = self.orphans.get(request_id)
        return route is not None and route.client is node and route.server is None and not route.held

    def hold_reply(self, route: Route, command: Command, frames: list) -> None:
        size = sum(map(len, frames))
        if len(route.held) >= MAX_HELD_REPLIES or self.held_reply_bytes + size > MAX_HELD_REPLY_BYTES:
            self.metrics["dropped.held_overflow"] += 1
            return
        route.held.append((command, [raw_bytes(f) for f in frames]))   # copies: the frames' buffers are reused
        self.held_reply_bytes += size
        self.metrics["held.reply"] += 1

    def _drop_held(self, route: Route) -> list:
        held, route.held = route.held, []
        self.held_reply_bytes -= sum(len(f) for _, frames in held for f in frames)
        return held

    def _release_held(self, route: Route, now: float) -> None:
        client = route.client
        assert client is not None, "held replies are released to the client that re-registered"
        held = self._drop_held(route)
        for command, frames in held:
            route.num_replies += 1
            client.timers.last_sent = now
            self.outbox.append([client.identity, *frames])
            self.metrics["routed.reply"] += 1
            if command is not Command.PARTIAL:
                self.finish(route)
                return

    def adopt_requests(self, new: Node, ready: Ready, old: Node | None, now: float) -> None:
        """Attach the requests a (re-)registering node announces; see the module docstring."""
        for request_id in ready.inflight:
            route = self._route_for(request_id.encode(), new.role, now)
            if route.server is None or route.server is old:
                if route.server is not None:
                    route.server.serving.discard(route.request_id)
                route.server = new
                new.serving.add(route.request_id)
            self._settle(route)
        for request_id in ready.pending:
            queued = self.queue.by_id.get(request_id.encode())
            if queued is not None:   # still waiting for capacity: keep its place in the queue
                queued.client = new
                continue
            route = self._route_for(request_id.encode(), "", now)
            if route.client is None or route.client is old:
                if route.client is not None:
                    route.client.waiting.discard(route.request_id)
                route.client = new
                new.waiting.add(route.request_id)
            self._settle(route)
            if route.held:
                self._release_held(route, now)

    def on_adopt(self, node: Node, command: Command, frames: list, now: float) -> None:
        """ADOPT: requests a registered node moved here from a broker it lost (docs/PROTOCOL.md
        §1.12), adopted as a READY's are; a gateway may not announce requests it serves."""
        try:
            adopt = codec.decode(frames)
            assert isinstance(adopt, Adopt)   # dispatched on its command byte
            if adopt.inflight and node.role not in SERVING_ROLES:
                raise ProtocolError(DropReason.MALFORMED, f"role {node.role!r} serves nothing: no inflight")
        except ProtocolError as exc:
            self.reject(node.identity, exc, frames)
            return
        self.metrics["adopted.requests"] += len(adopt.inflight) + len(adopt.pending)
        self.events.append(RequestsAdopted(node.node_id, len(adopt.inflight), len(adopt.pending)))
        self.adopt_requests(node, Ready(node.role, node.node_id, inflight=adopt.inflight, pending=adopt.pending),
                            None, now)

    def _route_for(self, request_id: bytes, service: str, now: float) -> Route:
        route = self.routes.get(request_id)
        if route is None:
            route = self.routes[request_id] = self.orphans[request_id] = Route(
                request_id, service, None, None, now)
            self.metrics["routes.adopted"] += 1
        return route

    def _settle(self, route: Route) -> None:
        if route.client is not None and route.server is not None:
            self.orphans.pop(route.request_id, None)

    def expire_orphans(self, now: float) -> None:
        for route in list(self.orphans.values()):
            if now - route.created_at <= self.orphan_grace_s:
                continue
            unclaimed = route.client is None and route.held and route.held[-1][0] is not Command.PARTIAL
            self.finish(route)
            if unclaimed:
                self.metrics["dropped.unclaimed_reply"] += 1   # replayed after its client had it all
                continue
            self.metrics["failed.request_lost"] += 1
            if route.client is not None:
                self.send_error(route.client.identity, route.request_id.decode(errors="replace"),
                                ErrorCode.REQUEST_LOST, "no node re-announced this request")
            self._cancel_server(route, now)
