"""The node registry of the sans-I/O broker: READY, HEARTBEAT, DISCONNECT and CAPACITY.

Contract: a base of `bus.broker_core.BrokerCore` sharing its tables (`nodes_by_identity`,
`nodes_by_id`, and `by_service` of `bus.broker_routes.RouteTable`) and output (`outbox`, `events`,
`metrics`). Its handlers take `(node, command, frames, now)` like the routing handlers.
- READY registers a node (from an unregistered sender too, with its identity) once
  `bus.broker_admission` lets it (else `reject`: nothing of the sender is registered), lists it
  under its role's services, adopts the requests it announces (`bus.broker_restart`), acknowledges
  it with a HEARTBEAT and releases the DIRECTs held for it. A registration it supersedes (READY
  again on the same socket, or the same node id from a new one) leaves as `replaced` first.
- `_forget(node, reason, now)`: the node leaves (`NodeLeft`): unlisted, what it served failed,
  what it asked for cancelled (`fail_node_requests`). DISCONNECT is a leave as `disconnected`.
- HEARTBEAT is only life (the core stamps `last_seen` for every message). CAPACITY replaces the
  node's capacity. A join and a CAPACITY offer the deferred queue again.
- The policy hears every join, leave and capacity change; a hook that raises is counted
  (`failed.policy`), never the broker's failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bus.broker_tables import BrokerEvent, CapacityChanged, Node, NodeJoined, NodeLeft, PeerRejected
from bus.codec import HEADERS, ProtocolError
from bus.constants import Command, LeaveReason
from bus.liveness import LinkTimers
from bus.messages import CapacityUpdate, Message, Ready

if TYPE_CHECKING:
    from collections import Counter

    from bus.broker_admission import Admission
    from bus.broker_queue import DeferredQueue
    from bus.routing import RoutingPolicy

HEARTBEAT_FRAMES = [HEADERS[Command.HEARTBEAT]]   # a HEARTBEAT's frames: the core's too


class NodeRegistry:
    admission: Admission
    policy: RoutingPolicy
    nodes_by_identity: dict[bytes, Node]
    nodes_by_id: dict[str, Node]
    by_service: dict[bytes, tuple[Node, ...]]
    queue: DeferredQueue
    events: list[BrokerEvent]
    metrics: Counter[str]
    send: Callable[[Node, list, float], None]
    reject: Callable[[bytes, ProtocolError, list], None]
    decoded: Callable[[bytes, list], Message | None]
    adopt_requests: Callable[[Node, Ready, Node | None, float], None]
    release_directs: Callable[[Node, float], None]
    dispatch_queued: Callable[[float], None]
    fail_node_requests: Callable[[Node, float], tuple[str, ...]]

    def _on_ready(self, node: Node | None, command: Command, frames: list, now: float,
                  identity: bytes | None = None) -> None:
        if identity is None:
            assert node is not None, "a READY comes from a registered node or with its sender's identity"
            identity = node.identity
        if (ready := self.decoded(identity, frames)) is None:
            return
        assert isinstance(ready, Ready)
        refusal = self.admission.refusal(ready, frames[0], self.nodes_by_id)
        if refusal is not None:
            self.reject(identity, refusal, frames)
            return
        if node is not None:   # READY again on the same socket: start afresh, keep its requests
            self._unlist(node)
        new = Node(identity=identity, node_id=ready.node_id, role=ready.role,
                   capacity=dict(ready.capacity), data_endpoint=ready.data_endpoint,
                   timers=LinkTimers(last_seen=now, last_sent=now), joined_at=now,
                   node_id_frame=ready.node_id.encode())
        previous = self.nodes_by_id.get(ready.node_id)
        self._list(new)
        self.adopt_requests(new, ready, node or previous, now)
        # Whatever registration this READY supersedes leaves as `replaced`, so policies and
        # listeners always see a leave before the join of the same node id.
        for old in {id(n): n for n in (node, previous) if n is not None}.values():
            self._forget(old, LeaveReason.REPLACED, now)
        self.metrics["nodes.joined"] += 1
        self.events.append(NodeJoined(new.node_id, new.role, dict(new.capacity), new.data_endpoint,
                                      len(ready.inflight)))
        self._tell_policy(self.policy.on_join, new)
        self.send(new, list(HEARTBEAT_FRAMES), now)   # acknowledges the registration
        self.release_directs(new, now)
        if self.queue.by_id:
            self.dispatch_queued(now)

    def _list(self, node: Node) -> None:
        self.nodes_by_identity[node.identity] = node
        self.nodes_by_id[node.node_id] = node
        for service in node.services:
            self.by_service[service.encode()] = (*self.by_service.get(service.encode(), ()), node)

    def _unlist(self, node: Node) -> None:
        if self.nodes_by_identity.get(node.identity) is node:
            del self.nodes_by_identity[node.identity]
        if self.nodes_by_id.get(node.node_id) is node:
            del self.nodes_by_id[node.node_id]
        for service in node.services:
            key = service.encode()
            remaining = tuple(n for n in self.by_service.get(key, ()) if n is not node)
            if remaining:
                self.by_service[key] = remaining
            else:
                self.by_service.pop(key, None)

    def _forget(self, node: Node, reason: str, now: float) -> None:
        """Drop `node`; fail what it was serving, cancel what it asked for."""
        self._unlist(node)
        self._tell_policy(self.policy.on_leave, node, reason)
        lost = self.fail_node_requests(node, now)
        self.metrics["nodes.left"] += 1
        self.metrics[f"nodes.left.{reason}"] += 1
        self.events.append(NodeLeft(node.node_id, node.role, reason, lost, now - node.timers.last_seen))

    def _tell_policy(self, hook: Callable[..., None], *args: Any) -> None:
        """A registry change for the policy; its failure is counted, never the broker's."""
        try:
            hook(*args)
        except Exception as exc:
            self.metrics["failed.policy"] += 1
            self.events.append(PeerRejected("internal_error", f"policy {hook.__name__}: {type(exc).__name__}",
                                            None, b""))

    def _on_heartbeat(self, node: Node, command: Command, frames: list, now: float) -> None:
        pass   # on_frames already counted it as life

    def _on_disconnect(self, node: Node, command: Command, frames: list, now: float) -> None:
        self._forget(node, LeaveReason.DISCONNECTED, now)

    def _on_capacity(self, node: Node, command: Command, frames: list, now: float) -> None:
        if (update := self.decoded(node.identity, frames)) is None:
            return
        assert isinstance(update, CapacityUpdate)   # dispatched on its command byte
        node.capacity = dict(update.capacity)
        self._tell_policy(self.policy.on_capacity, node)
        self.events.append(CapacityChanged(node.node_id, dict(node.capacity)))
        if self.queue.by_id:
            self.dispatch_queued(now)
