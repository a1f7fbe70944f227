"""The request-routing half of the sans-I/O broker: REQUEST -> a node, replies -> the client.

Contract: a base class of `BrokerCore` sharing its tables (`routes`, `by_service`) and output
(`outbox`, `metrics`). Handlers read only the header and routing frames; body and payload frames
are forwarded as received. A route lives from REQUEST until FINAL, ERROR or CANCEL, or until
either end leaves: the client then gets ERROR `node_lost` (details: node_id, num_replies
forwarded so far) and the serving node gets CANCEL `client_lost`.
After a broker restart, routes are rebuilt from READY.inflight (server side) and READY.pending
(client side), replies held for clients not back yet (`bus.broker_restart`). A DIRECT for a node id not registered is held for `orphan_grace_s` too
(`bus.broker_directs`) and forwarded if that node registers, else answered `unknown_node`.
A request the policy defers (`bus.routing.Defer`) waits in `queue` (`bus.broker_queue`) with no
route yet; `dispatch_queued(now)` offers the queues' heads again and `expire_queued(now)` answers
the requests that waited too long with ERROR `overloaded`. A client's CANCEL or departure just
drops its queued requests (no node has seen them). Service names and keys are bounded (1..128
and 0..128 bytes); a policy that raises fails only that request (ERROR `internal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import codec
from bus import constants as c
from bus.broker_directs import DirectRoutes, HeldDirects
from bus.broker_queue import MAX_QUEUED_BYTES, Deferred, DeferredQueue
from bus.broker_restart import RestartRoutes
from bus.broker_streams import StreamRoutes
from bus.broker_tables import Node, Route
from bus.codec import ProtocolError, raw_bytes
from bus.constants import CancelReason, Command, ErrorCode
from bus.messages import Cancel, Final
from bus.routing import Defer, Refuse, RoutingPolicy

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Callable


_BROKER_STATS = c.BROKER_STATS_SERVICE.encode()
_SERVICES = frozenset(service for services in c.SERVICES_BY_ROLE.values() for service in services)


class RouteTable(DirectRoutes, RestartRoutes, StreamRoutes):
    outbox: list[list]
    metrics: Counter[str]
    policy: RoutingPolicy
    nodes_by_id: dict[str, Node]
    send_error: Callable[..., None]
    send: Callable[[Node, list, float], None]

    def __init__(self, orphan_grace_s: float = 1.5) -> None:
        self.by_service: dict[bytes, tuple[Node, ...]] = {}
        self.routes: dict[bytes, Route] = {}
        self.orphans: dict[bytes, Route] = {}
        self.orphan_grace_s = orphan_grace_s
        self.held_reply_bytes = 0
        self.queue = DeferredQueue()
        self.held_directs = HeldDirects(orphan_grace_s)

    # -- the hot path --------------------------------------------------------------------

    def on_request(self, node: Node, command: Command, frames: list, now: float) -> None:
        request_id, service, key = raw_bytes(frames[2]), raw_bytes(frames[1]), raw_bytes(frames[4])
        if not 0 < len(request_id) <= c.MAX_ID_BYTES:
            self.metrics["dropped.malformed"] += 1
            self.send_error(node.identity, "", ErrorCode.MALFORMED, "request_id must be 1..128 bytes")
            return
        if not 0 < len(service) <= c.MAX_ID_BYTES or len(key) > c.MAX_ID_BYTES:
            self.metrics["dropped.malformed"] += 1
            self._refuse(node, request_id, ErrorCode.MALFORMED,
                         "service must be 1..128 bytes and key at most 128 bytes")
            return
        if self.is_placeholder_of(request_id, node):
            # Announced as pending in READY before it was sent (it waited in the client's
            # backlog across a broker restart): this is the request itself, route it.
            self.finish(self.routes[request_id])
        if request_id in self.routes or request_id in self.queue.by_id:
            self._refuse(node, request_id, ErrorCode.DUPLICATE_REQUEST, "request id already in flight")
            return
        if service == _BROKER_STATS:
            self.metrics["answered.stats"] += 1
            self.send(node, codec.encode(Final(request_id.decode(errors="replace"), 0, self.stats())), now)
            return
        self.dispatch(node, request_id, service, frames, now, None)

    def stats(self) -> dict:
        """What `BROKER_STATS_SERVICE` answers: live nodes by role, waiting requests by service, and
        the last capacity report and the role of each serving node (at most c.MAX_STATS_NODES, by node id)."""
        roles: dict[str, int] = {}
        for live in self.nodes_by_id.values():
            roles[live.role] = roles.get(live.role, 0) + 1
        queued = {name.decode(errors="replace"): self.queue.num_queued(name) for name in self.by_service}
        serving = sorted(node_id for node_id, n in self.nodes_by_id.items() if n.services)[:c.MAX_STATS_NODES]
        capacities = {node_id: dict(self.nodes_by_id[node_id].capacity) for node_id in serving}
        return {"nodes_by_role": roles, "queued_by_service": queued, "num_routes": len(self.routes),
                "capacity_by_node": capacities,
                "role_by_node": {node_id: self.nodes_by_id[node_id].role for node_id in serving}}

    def dispatch(self, node: Node, request_id: bytes, service: bytes, frames: list, now: float,
                 queued: Deferred | None) -> bool:
        """Route, refuse or defer one request; False when `queued` must stay in the queue."""
        candidates = self.by_service.get(service)
        try:
            target = candidates and self.policy.choose(
                service.decode(errors="replace"), raw_bytes(frames[4]).decode(errors="replace"),
                request_id.decode(errors="replace"), candidates)
        except Refuse as refusal:
            self.metrics[f"rejected.{refusal.code}"] += 1
            self.send_error(node.identity, request_id.decode(errors="replace"), refusal.code,
                            refusal.message, **refusal.details)
            return True
        except Defer as defer:
            return self._defer(node, request_id, service, frames, now, defer, queued)
        except Exception as exc:   # the policy failed on this request: it alone gets the error
            self.metrics["failed.policy"] += 1
            self._refuse(node, request_id, ErrorCode.INTERNAL, f"routing failed: {type(exc).__name__}")
            return True
        if not target:
            name = service.decode(errors="replace")
            # Per service too: `rejected.no_node.prefill` counts the clients that fall back to
            # prefilling on their decode node. Peer-chosen names share one counter.
            self.metrics[f"rejected.{ErrorCode.NO_NODE}.{name if name in _SERVICES else 'other'}"] += 1
            self._refuse(node, request_id, ErrorCode.NO_NODE, f"no live node serves {name[:64]!r}")
            return True
        self.routes[request_id] = Route(request_id, service.decode(errors="replace"), node, target, now)
        node.waiting.add(request_id)
        target.serving.add(request_id)
        target.num_assigned += 1
        target.timers.last_sent = now
        self.outbox.append([target.identity, frames[0], frames[1], frames[2], node.node_id_frame,
                            *frames[4:]])
        self.metrics["routed.request"] += 1
        return True

    def on_reply(self, node: Node, command: Command, frames: list, now: float) -> None:
        """PARTIAL, FINAL or ERROR from the node serving the request."""
        route = self.routes.get(raw_bytes(frames[1]))
        if route is not None and route.server is node and route.client is None and route.request_id in self.orphans:
            self.hold_reply(route, command, frames)
            return
        if route is None or route.server is not node or route.client is None:
            self.metrics["dropped.unknown_request"] += 1
            if route is not None and route.server is node and command is not Command.PARTIAL:
                self.finish(route)
            return
        route.num_replies += 1
        if command is not Command.PARTIAL:
            self.finish(route)
        route.client.timers.last_sent = now
        self.outbox.append([route.client.identity, *frames])
        self.metrics["routed.reply"] += 1

    def on_cancel(self, node: Node, command: Command, frames: list, now: float) -> None:
        route = self.routes.get(raw_bytes(frames[1]))
        if route is None or route.client is not node:
            queued = self.queue.by_id.get(raw_bytes(frames[1]))
            if queued is not None and queued.client is node:
                self.queue.remove(queued.request_id)
                self.metrics["queue.cancelled"] += 1
                return
            self.metrics["dropped.unknown_request"] += 1
            return
        self.finish(route)
        if route.server is not None:
            route.server.timers.last_sent = now
            self.outbox.append([route.server.identity, *frames])
        self.metrics["routed.cancel"] += 1

    # -- the deferred-request queue ------------------------------------------------------

    def _defer(self, node: Node, request_id: bytes, service: bytes, frames: list, now: float,
               defer: Defer, queued: Deferred | None) -> bool:
        if queued is not None:
            return False
        if (self.queue.num_queued(service) >= defer.max_queued
                or self.queue.num_bytes + sum(map(len, frames)) > MAX_QUEUED_BYTES):
            self.metrics[f"rejected.{ErrorCode.OVERLOADED}"] += 1
            self.send_error(node.identity, request_id.decode(errors="replace"), ErrorCode.OVERLOADED,
                            f"{defer.message}; {defer.max_queued} requests already waiting",
                            retry_after_s=defer.retry_after_s)
            return True
        self.queue.push(Deferred(request_id, service, node, frames, now, now + defer.timeout_s,
                                 defer.retry_after_s))
        self.metrics["queue.deferred"] += 1
        return True

    def dispatch_queued(self, now: float) -> None:
        """Offer each service's waiting requests to the policy, oldest first, until one of
        them is deferred again (the rest of that queue would be too)."""
        for head in self.queue.heads():
            entry: Deferred | None = head
            while entry is not None:
                if not self.dispatch(entry.client, entry.request_id, entry.service, entry.frames,
                                     now, entry):
                    break
                self.queue.remove(entry.request_id)
                if entry.request_id in self.routes:   # not refused or no_node on the way out
                    self.metrics["queue.dispatched"] += 1
                entry = self.queue.head(entry.service)

    def expire_queued(self, now: float) -> None:
        for entry in self.queue.expired(now):
            self.metrics["queue.timed_out"] += 1
            self.metrics[f"rejected.{ErrorCode.OVERLOADED}"] += 1
            entry.client.timers.last_sent = now
            self.send_error(entry.client.identity, entry.request_id.decode(errors="replace"),
                            ErrorCode.OVERLOADED, f"no capacity within {now - entry.queued_at:.1f}s",
                            retry_after_s=entry.retry_after_s)

    # -- route lifecycle -----------------------------------------------------------------

    def finish(self, route: Route) -> None:
        if route.held:
            self._drop_held(route)
        self.routes.pop(route.request_id, None)
        self.orphans.pop(route.request_id, None)
        if route.client is not None:
            route.client.waiting.discard(route.request_id)
        if route.server is not None:
            route.server.serving.discard(route.request_id)

    def _refuse(self, node: Node, request_id: bytes, code: str, message: str) -> None:
        self.metrics[f"rejected.{code}"] += 1
        self.send_error(node.identity, request_id.decode(errors="replace"), code, message)

    def fail_node_requests(self, node: Node, now: float) -> tuple[str, ...]:
        """`node` is gone: its clients get ERROR node_lost, its servers get CANCEL client_lost."""
        lost = []
        for request_id in list(node.serving):
            route = self.routes.get(request_id)
            if route is None or route.server is not node:
                continue
            self.finish(route)
            lost.append(request_id.decode(errors="replace"))
            if route.client is not None:
                self.metrics["failed.node_lost"] += 1
                route.client.timers.last_sent = now
                self.send_error(route.client.identity, lost[-1], ErrorCode.NODE_LOST,
                                f"node {node.node_id} left", node_id=node.node_id,
                                num_replies=route.num_replies)
        for request_id in list(node.waiting):
            route = self.routes.get(request_id)
            if route is not None and route.client is node:
                self.finish(route)
                self._cancel_server(route, now)
        if self.queue.by_id:
            for entry in self.queue.of_client(node):
                self.queue.remove(entry.request_id)
                self.metrics["queue.cancelled"] += 1
        return tuple(lost)

    def _cancel_server(self, route: Route, now: float) -> None:
        if route.server is not None:
            self.metrics["cancelled.client_lost"] += 1
            route.server.timers.last_sent = now
            cancel = Cancel(route.request_id.decode(errors="replace"), CancelReason.CLIENT_LOST)
            self.outbox.append([route.server.identity, *codec.encode(cancel)])

    def fail_rejected_request(self, identity: bytes, node: Node | None, exc: ProtocolError,
                              request_id: str) -> None:
        """A message of request `request_id` was refused (`exc`): ERROR to its sender; if it was
        a serving node's reply, the client's stream is broken too, so end it for both."""
        route = self.routes.get(request_id.encode())
        if node is not None and route is not None and route.server is node:
            self.finish(route)
            if route.client is not None:
                self.send_error(route.client.identity, request_id, exc.reason,
                                f"reply refused by the broker: {exc.detail}")
        self.send_error(identity, request_id, exc.reason, exc.detail)
