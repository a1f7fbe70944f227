"""The KV sender's connections to decode nodes' data endpoints, and how long it keeps them.

Contract: `Peers(open_connection, max_peers=128, idle_s=60.0)`, where `open_connection(endpoint)`
makes a `Connection` (the sender's DEALER, its synchronous shadow and its reader task).
`take(endpoint)` returns the endpoint's connection, opening one when there is none, and must be
followed, without an await in between, by registering the transfer in `connection.transfers`;
`put(endpoint, connection)` is called once that transfer is over. Lifetime rules:
- a connection with a transfer in flight is never closed (only `close_all` closes it);
- one with none for `idle_s` is closed and forgotten: a decode node that restarted on a new port
  leaves no DEALER reconnecting to the old one for ever;
- at most `max_peers` are open: taking a new endpoint closes the least recently used idle one,
  and raises KVTransferFailed (before a byte is sent) when every one has a transfer in flight.
Closing a connection cancels its reader and link tasks and closes its socket at once (LINGER 0).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from bus.kv.kv_errors import KVTransferFailed
from bus.log import get_logger

log = get_logger("kv.sender")


@dataclass
class Connection:
    socket: zmq.asyncio.Socket
    polled: zmq.Socket          # the same socket, synchronous: replies read between two encodes
    reader: asyncio.Task | None = None
    transfers: dict = field(default_factory=dict)         # transfer id -> (SendTransfer, wakeup Event)
    link: asyncio.Task | None = None                      # shaped links only: the "wire"
    outbox: deque = field(default_factory=deque)          # (release time, frames), in release order
    queued: asyncio.Event = field(default_factory=asyncio.Event)
    idle_timer: asyncio.TimerHandle | None = None

    def tasks(self) -> list[asyncio.Task]:
        return [task for task in (self.reader, self.link) if task is not None]

    def close(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for task in self.tasks():
            task.cancel()
        self.socket.close(linger=0)   # also cancels the reader's pending receive


class Peers:
    def __init__(self, open_connection: Callable[[str], Connection], max_peers: int = 128,
                 idle_s: float = 60.0) -> None:
        if max_peers < 1 or idle_s <= 0:
            raise ValueError("max_peers must be >= 1 and idle_s > 0")
        self._open = open_connection
        self.max_peers, self.idle_s = max_peers, idle_s
        self._connections: dict[str, Connection] = {}   # least recently used first

    def take(self, endpoint: str) -> Connection:
        connection = self._connections.pop(endpoint, None)
        if connection is None:
            self._make_room()
            connection = self._open(endpoint)
        elif connection.idle_timer is not None:
            connection.idle_timer.cancel()
            connection.idle_timer = None
        self._connections[endpoint] = connection   # now the most recently used
        return connection

    def put(self, endpoint: str, connection: Connection) -> None:
        if connection.transfers or self._connections.get(endpoint) is not connection:
            return
        if connection.idle_timer is not None:
            connection.idle_timer.cancel()
        loop = asyncio.get_running_loop()
        connection.idle_timer = loop.call_later(self.idle_s, self._expire, endpoint, connection)

    def _expire(self, endpoint: str, connection: Connection) -> None:
        if self._connections.get(endpoint) is connection and not connection.transfers:
            self._retire(endpoint)

    def _make_room(self) -> None:
        if len(self._connections) < self.max_peers:
            return
        idle = next((endpoint for endpoint, c in self._connections.items() if not c.transfers), None)
        if idle is None:
            raise KVTransferFailed("", f"all {self.max_peers} data endpoints (max_peers) have transfers "
                                       "in flight: no room for another")
        self._retire(idle)

    def _retire(self, endpoint: str) -> None:
        self._connections.pop(endpoint).close()
        log.info("kv_peer_closed", endpoint=endpoint)

    def get(self, endpoint: str) -> Connection | None:
        return self._connections.get(endpoint)

    def endpoints(self) -> list[str]:
        """Open endpoints, least recently used first."""
        return list(self._connections)

    def connections(self) -> list[Connection]:
        return list(self._connections.values())

    async def close_all(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()
            for task in connection.tasks():
                with contextlib.suppress(asyncio.CancelledError):
                    await task
