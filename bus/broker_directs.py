"""DIRECT messages for a node that is not registered (yet), held for a short grace.

Why: after a broker restart, or a node's brief link loss, the sender may re-register and resend a
DIRECT before its peer is back (a prefill node's `kv_ready` to its decode node: without it the
decode node never starts the stream). Holding it until the peer registers turns that race into
a short delay instead of a stalled request.

Contract (plain data, no sockets): `HeldDirects(grace_s, max_held, max_bytes)`;
`hold(peer, sender_identity, frames, now) -> bool` keeps a copy of the frames to forward (False
when `max_held` messages or `max_bytes` are already held: the caller refuses as it would
without holding);
`release(peer) -> list[frames]` when `peer` registers, in the order they came;
`expire(now) -> list[(sender_identity, peer)]`: those held past `grace_s`, which the caller answers
with ERROR `unknown_node` as it did before (the sender learns the peer is gone).
`DirectRoutes` is the DIRECT half of the broker's routing, a base of `bus.broker_routes.RouteTable`
sharing its tables and output: `on_direct`, `release_directs(node, now)` on a registration,
`expire_directs(now)` on a tick. DIRECTs pass only between serving nodes (prefill, decode,
both): a gateway neither sends nor receives one (ERROR `forbidden`, request id "").
`on_control`: a CONTROL passes only from a `control` peer to a registered serving node, its body
decoded and bounded first (malformed: the sender is refused as for any bad body); it is not held
for an absent node (ERROR `unknown_node`: the sender decides again on fresh stats).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bus import constants as c
from bus.codec import raw_bytes
from bus.constants import Command, ErrorCode
from bus.messages import Control, Message

MAX_HELD_BYTES = 64 << 20   # what DIRECTs waiting for their peer may hold in all

if TYPE_CHECKING:
    from bus.broker_tables import Node


@dataclass(slots=True)
class _Held:
    peer: str
    sender: bytes
    frames: list
    until: float


class HeldDirects:
    def __init__(self, grace_s: float, max_held: int = 1024, max_bytes: int = MAX_HELD_BYTES) -> None:
        self.grace_s = grace_s
        self.max_held = max_held
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._held: deque[_Held] = deque()   # in arrival order, so expiry pops from the left

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, peer: str, sender: bytes, frames: list, now: float) -> bool:
        size = sum(map(len, frames))
        if len(self._held) >= self.max_held or self.num_bytes + size > self.max_bytes:
            return False
        self._held.append(_Held(peer, sender, [bytes(f) for f in frames], now + self.grace_s))
        self.num_bytes += size
        return True

    def release(self, peer: str) -> list[list]:
        if not self._held:
            return []
        mine = [h.frames for h in self._held if h.peer == peer]
        if mine:
            self._held = deque(h for h in self._held if h.peer != peer)
            self.num_bytes -= sum(len(f) for frames in mine for f in frames)
        return mine

    def expire(self, now: float) -> list[tuple[bytes, str]]:
        expired = []
        while self._held and self._held[0].until <= now:
            held = self._held.popleft()
            self.num_bytes -= sum(map(len, held.frames))
            expired.append((held.sender, held.peer))
        return expired


class DirectRoutes:
    outbox: list[list]
    metrics: Counter[str]
    nodes_by_id: dict[str, Node]
    send_error: Callable[..., None]
    reject: Callable[..., None]
    decoded: Callable[[bytes, list], Message | None]
    held_directs: HeldDirects

    def on_direct(self, node: Node, command: Command, frames: list, now: float) -> None:
        peer_frame = raw_bytes(frames[1])
        if not 0 < len(peer_frame) <= c.MAX_ID_BYTES:
            self.metrics["dropped.malformed"] += 1
            self.send_error(node.identity, "", ErrorCode.MALFORMED, "DIRECT peer must be 1..128 bytes")
            return
        peer = peer_frame.decode(errors="replace")
        delivered = [frames[0], node.node_id_frame, *frames[2:]]   # `peer` becomes the sender's id
        target = self.nodes_by_id.get(peer)
        if node.role not in c.SERVING_ROLES or (target is not None and target.role not in c.SERVING_ROLES):
            self.metrics["rejected.forbidden_direct"] += 1
            self.send_error(node.identity, "", ErrorCode.FORBIDDEN, "DIRECTs pass only between serving nodes")
            return
        if target is not None:
            target.timers.last_sent = now
            self.outbox.append([target.identity, *delivered])
            self.metrics["routed.direct"] += 1
        elif self.held_directs.hold(peer, node.identity, delivered, now):
            # Maybe not back yet (broker restart, a brief link loss): forwarded if it registers
            # within the grace, answered `unknown_node` otherwise.
            self.metrics["held.direct"] += 1
        else:
            self.metrics["rejected.unknown_node"] += 1
            self.send_error(node.identity, "", ErrorCode.UNKNOWN_NODE, f"no node {peer!r}", peer=peer)

    def on_control(self, node: Node, command: Command, frames: list, now: float) -> None:
        if (control := self.decoded(node.identity, frames)) is None:
            return
        assert isinstance(control, Control)   # dispatched on its command byte
        target = self.nodes_by_id.get(control.peer)
        if node.role not in c.CONTROL_ROLES or (target is not None and target.role not in c.SERVING_ROLES):
            self.metrics["rejected.forbidden_control"] += 1
            self.send_error(node.identity, "", ErrorCode.FORBIDDEN, "CONTROL passes only from a control peer to a serving node")
            return
        if target is None:
            self.metrics["rejected.unknown_node"] += 1
            self.send_error(node.identity, "", ErrorCode.UNKNOWN_NODE, f"no node {control.peer!r}", peer=control.peer)
            return
        target.timers.last_sent = now
        self.outbox.append([target.identity, frames[0], node.node_id_frame, frames[2]])
        self.metrics["routed.control"] += 1

    def release_directs(self, node: Node, now: float) -> None:
        """DIRECTs held for `node`'s id go to it now that it is registered."""
        for frames in self.held_directs.release(node.node_id):
            node.timers.last_sent = now
            self.outbox.append([node.identity, *frames])
            self.metrics["routed.direct"] += 1

    def expire_directs(self, now: float) -> None:
        for sender, peer in self.held_directs.expire(now):
            self.metrics["rejected.unknown_node"] += 1
            self.send_error(sender, "", ErrorCode.UNKNOWN_NODE, f"no node {peer!r}", peer=peer)
