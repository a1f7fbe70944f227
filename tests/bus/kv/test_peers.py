"""The sender's peer table (bus/kv/peers.py) without sockets: LRU room-making, idle expiry, and a
connection with a transfer in flight never closed."""

from __future__ import annotations

import asyncio

import pytest

from bus.kv.kv_errors import KVTransferFailed
from bus.kv.peers import Connection, Peers


class FakeSocket:
    closed = False

    def close(self, linger: int = 0) -> None:
        self.closed = True


def table(max_peers: int = 2, idle_s: float = 60.0) -> tuple[Peers, dict[str, Connection]]:
    opened: dict[str, Connection] = {}

    def open_connection(endpoint: str) -> Connection:
        opened[endpoint] = Connection(FakeSocket(), None)
        return opened[endpoint]
    return Peers(open_connection, max_peers, idle_s), opened


async def use(peers: Peers, endpoint: str) -> Connection:
    """A transfer that starts and ends on `endpoint`."""
    connection = peers.take(endpoint)
    peers.put(endpoint, connection)
    return connection


async def test_the_least_recently_used_idle_peer_makes_room():
    peers, opened = table(max_peers=2)
    await use(peers, "a")
    await use(peers, "b")
    await use(peers, "a")                 # a is now the most recently used
    await use(peers, "c")
    assert peers.endpoints() == ["a", "c"] and opened["b"].socket.closed and not opened["a"].socket.closed


async def test_a_peer_with_a_transfer_in_flight_is_never_closed_and_a_full_table_refuses():
    peers, opened = table(max_peers=2)
    for endpoint in ("a", "b"):
        peers.take(endpoint).transfers["t-" + endpoint] = object()
    with pytest.raises(KVTransferFailed, match="max_peers"):
        peers.take("c")
    assert peers.endpoints() == ["a", "b"] and not any(c.socket.closed for c in opened.values())
    del opened["a"].transfers["t-a"]
    peers.put("a", opened["a"])
    peers.take("c")
    assert peers.endpoints() == ["b", "c"] and opened["a"].socket.closed


async def test_an_idle_peer_expires_and_one_in_use_does_not():
    peers, opened = table(idle_s=0.05)
    await use(peers, "a")
    busy = peers.take("b")
    busy.transfers["t"] = object()
    peers.put("b", busy)                  # still a transfer in flight: no timer
    await asyncio.sleep(0.15)
    assert peers.endpoints() == ["b"] and opened["a"].socket.closed and not busy.socket.closed
    again = await use(peers, "a")         # a later send opens a fresh connection
    assert not again.socket.closed
    peers.take("a")                       # taken again before it expired: its timer is off
    await asyncio.sleep(0.15)
    assert "a" in peers.endpoints()


async def test_close_all_closes_every_connection():
    peers, opened = table()
    await use(peers, "a")
    peers.take("b").transfers["t"] = object()
    await peers.close_all()
    assert peers.endpoints() == [] and all(c.socket.closed for c in opened.values())
