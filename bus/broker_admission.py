"""Who may register as what: the broker's checks on a decoded READY, before anything is listed.

Contract (plain data; the broker core calls `refusal(ready, header_frame, nodes_by_id)` and
registers the sender only when it returns None):
- `authorize(header_frame, role) -> reason | None` (from the shell, CURVE only): the sender's
  key must be admitted for the role (`forbidden`).
- `identify(header_frame) -> owner | None` (from the shell, CURVE only: the sender's public key).
  A node id is bound to the owner that first registered it: a READY for that node id from
  another owner is `forbidden` and changes nothing, so an admitted key cannot take over another
  node's id, its routes, its DIRECTs or its streams. Bindings outlive a node's departure (it
  comes back under the same key); at most `max_bindings` are kept, the least recently used
  binding of a node id not registered now is dropped first. Plain mode has no owners to bind.
- A role that serves nothing (`gateway`) may not announce `inflight` requests (`malformed`):
  only a serving node can be given a request's replies to send.
- At most `max_nodes` registrations at once; a new node id beyond that is refused
  (`overloaded`) so that peer-chosen ids cannot grow the broker's tables without bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from bus import constants as c
from bus.codec import ProtocolError
from bus.messages import Ready

MAX_NODES = 65_536
MAX_BINDINGS = 4 * MAX_NODES


class Admission:
    def __init__(self, authorize: Callable[[Any, str], str | None] | None = None,
                 identify: Callable[[Any], str | None] | None = None,
                 max_nodes: int = MAX_NODES, max_bindings: int = MAX_BINDINGS) -> None:
        self.authorize = authorize
        self.identify = identify
        self.max_nodes = max_nodes
        self.max_bindings = max_bindings
        self.owners: OrderedDict[str, str] = OrderedDict()   # node id -> owner, least recent first

    def refusal(self, ready: Ready, header_frame: Any, nodes_by_id: Mapping[str, Any]) -> ProtocolError | None:
        """Why this READY may not register (None: it may; the node id is then bound)."""
        if ready.inflight and ready.role not in c.SERVING_ROLES:
            return ProtocolError(c.DropReason.MALFORMED, f"role {ready.role!r} serves nothing: no inflight")
        if ready.node_id not in nodes_by_id and len(nodes_by_id) >= self.max_nodes:
            return ProtocolError(c.DropReason.OVERLOADED, f"{self.max_nodes} nodes registered")
        reason = self.authorize(header_frame, ready.role) if self.authorize else None
        if reason is not None:
            return ProtocolError(c.DropReason.FORBIDDEN, reason)
        owner = self.identify(header_frame) if self.identify else None
        if owner is not None:
            return self._bind(ready.node_id, owner, nodes_by_id)
        return None

    def _bind(self, node_id: str, owner: str, nodes_by_id: Mapping[str, Any]) -> ProtocolError | None:
        bound = self.owners.get(node_id)
        if bound is not None and bound != owner:
            return ProtocolError(c.DropReason.FORBIDDEN, f"node id {node_id!r} belongs to another key")
        self.owners[node_id] = owner
        self.owners.move_to_end(node_id)
        if len(self.owners) > self.max_bindings:
            self._drop_one_binding(nodes_by_id)
        return None

    def _drop_one_binding(self, nodes_by_id: Mapping[str, Any]) -> None:
        for node_id in self.owners:
            if node_id not in nodes_by_id:
                del self.owners[node_id]
                return
