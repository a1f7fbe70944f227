"""The broker's tables as plain data: registered nodes, in-flight request routes, and the
join/leave/capacity events the broker emits.

Contract: `Node` and `Route` are owned and mutated only by `BrokerCore`; routing policies and
event listeners read them (treat as read-only). Request ids are kept as the raw bytes of their
wire frame so the hot path never decodes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bus.constants import SERVICES_BY_ROLE, Command
from bus.liveness import LinkTimers


@dataclass(slots=True, eq=False)
class Node:
    """A registered peer (prefill/decode/both node or a gateway client)."""

    identity: bytes               # ROUTER routing id of its current socket
    node_id: str
    role: str
    capacity: dict[str, float]
    data_endpoint: str
    timers: LinkTimers
    node_id_frame: bytes          # node_id encoded once, stamped into forwarded messages
    joined_at: float
    serving: set[bytes] = field(default_factory=set)   # requests routed to it, not finished
    waiting: set[bytes] = field(default_factory=set)   # requests it sent, not finished
    num_assigned: int = 0                              # requests ever routed to it
    connection_lost_at: float | None = None            # a send to it found its connection gone

    @property
    def num_outstanding(self) -> int:
        return len(self.serving)

    @property
    def services(self) -> tuple[str, ...]:
        return SERVICES_BY_ROLE[self.role]


@dataclass(slots=True, eq=False)
class Route:
    """One in-flight request: who asked (client) and who serves it (server)."""

    request_id: bytes
    service: str
    client: Node | None
    server: Node | None
    created_at: float
    num_replies: int = 0   # PARTIAL/FINAL messages forwarded to the client so far
    # Replies that came while the route had no client yet (adopted after a broker restart from
    # the server's READY before the client's): sent on when the client re-registers.
    held: list[tuple[Command, list]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NodeJoined:
    node_id: str
    role: str
    capacity: dict[str, float]
    data_endpoint: str
    num_inflight: int       # requests it re-announced in READY (after a broker restart)


@dataclass(frozen=True, slots=True)
class NodeLeft:
    node_id: str
    role: str
    reason: str                       # constants.LeaveReason
    lost_request_ids: tuple[str, ...]  # requests it was serving that were failed with node_lost
    silent_for_s: float               # time since the broker last heard from it


@dataclass(frozen=True, slots=True)
class CapacityChanged:
    node_id: str
    capacity: dict[str, float]


@dataclass(frozen=True, slots=True)
class PeerRejected:
    """A message was dropped (counted in metrics); logged by the shell."""

    reason: str
    detail: str
    node_id: str | None
    identity: bytes


@dataclass(frozen=True, slots=True)
class RequestsAdopted:
    """A registered node moved requests here from a broker it lost (ADOPT)."""

    node_id: str
    num_inflight: int   # requests it serves
    num_pending: int    # requests it awaits


BrokerEvent = NodeJoined | NodeLeft | CapacityChanged | PeerRejected | RequestsAdopted


def node_summary(node: Node) -> dict[str, Any]:
    return {"node_id": node.node_id, "role": node.role, "capacity": dict(node.capacity),
            "num_outstanding": node.num_outstanding}
