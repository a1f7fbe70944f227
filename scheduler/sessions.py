"""Which decode node each live session is on: the table that makes sessions sticky.

Contract: `SessionTable(max_sessions)` maps a session id to the node it was last placed on, with a
`SessionState` that only moves along `TRANSITIONS` (an illegal move raises `SessionError`):

    (absent) --place--> PLACED --place on another node--> PLACED   (a move: the node was full)
    PLACED --node_left--> ORPHANED --place--> PLACED                (a move: failover)

`place(session_id, node_id)` returns whether the session moved. The table forgets the least
recently placed session beyond `max_sessions` (a forgotten session is placed as a new one, by the
ring, which usually puts it back on the same node). Plain data, no clock: the broker process is
its only writer. A restarted broker starts empty and places sessions by the ring again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum


class SessionState(Enum):
    PLACED = "placed"        # on a live node
    ORPHANED = "orphaned"    # its node left; the next turn is placed elsewhere


class SessionEvent(Enum):
    PLACE = "place"
    NODE_LEFT = "node_left"


TRANSITIONS: dict[tuple[SessionState | None, SessionEvent], SessionState] = {
    (None, SessionEvent.PLACE): SessionState.PLACED,
    (SessionState.PLACED, SessionEvent.PLACE): SessionState.PLACED,
    (SessionState.PLACED, SessionEvent.NODE_LEFT): SessionState.ORPHANED,
    (SessionState.ORPHANED, SessionEvent.PLACE): SessionState.PLACED,
}


class SessionError(RuntimeError):
    """A session was asked to make a move its lifecycle does not allow."""


@dataclass(slots=True)
class Session:
    session_id: str
    node_id: str
    state: SessionState


def _next(state: SessionState | None, event: SessionEvent) -> SessionState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise SessionError(f"no transition from {state} on {event}") from None


class SessionTable:
    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._by_node: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def node_of(self, session_id: str) -> str | None:
        """The live node holding `session_id`, or None (unknown or orphaned)."""
        session = self._sessions.get(session_id)
        return session.node_id if session is not None and session.state is SessionState.PLACED else None

    def place(self, session_id: str, node_id: str) -> bool:
        """Record that `session_id` now lives on `node_id`; True when it moved from another node."""
        session = self._sessions.get(session_id)
        state = _next(session.state if session else None, SessionEvent.PLACE)
        if session is None:
            session = self._sessions[session_id] = Session(session_id, node_id, state)
            moved = False
            self._evict_beyond_limit()
        else:
            moved = session.node_id != node_id
            self._by_node.get(session.node_id, set()).discard(session_id)
            session.node_id, session.state = node_id, state
            self._sessions.move_to_end(session_id)
        self._by_node.setdefault(node_id, set()).add(session_id)
        return moved

    def node_left(self, node_id: str) -> int:
        """Orphan every session on `node_id`; how many there were."""
        orphaned = self._by_node.pop(node_id, set())
        for session_id in orphaned:
            session = self._sessions[session_id]
            session.state = _next(session.state, SessionEvent.NODE_LEFT)
        return len(orphaned)

    def num_on(self, node_id: str) -> int:
        return len(self._by_node.get(node_id, ()))

    def _evict_beyond_limit(self) -> None:
        while len(self._sessions) > self.max_sessions:
            session_id, session = self._sessions.popitem(last=False)
            self._by_node.get(session.node_id, set()).discard(session_id)
