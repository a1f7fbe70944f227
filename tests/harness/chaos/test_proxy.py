"""The partition proxy over real loopback sockets: forwards, swallows while cut (connections
stay open), and after healing drops the damaged connections and forwards new ones."""

from __future__ import annotations

import socket
import threading

import pytest

from harness.chaos.proxy import PartitionProxy


@pytest.fixture
def echo_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn):
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    return sock


def test_forwards_then_swallows_while_cut_then_heals(echo_port):
    proxy = PartitionProxy(echo_port).start()
    try:
        sock = connect(proxy.port)
        sock.sendall(b"ping")
        assert sock.recv(16) == b"ping"
        proxy.cut()
        sock.sendall(b"lost")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(16)   # nothing comes back, and the connection is not reset
        assert proxy.num_bytes_swallowed >= 4
        proxy.heal()
        sock.settimeout(2)
        assert sock.recv(16) == b""   # the damaged connection is closed
        fresh = connect(proxy.port)
        fresh.sendall(b"again")
        assert fresh.recv(16) == b"again"
        fresh.close()
        sock.close()
    finally:
        proxy.stop()


def test_a_connection_to_a_dead_target_is_closed(echo_port):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    dead_port = probe.getsockname()[1]
    probe.close()
    proxy = PartitionProxy(dead_port).start()
    try:
        sock = connect(proxy.port)
        assert sock.recv(16) == b""
        sock.close()
    finally:
        proxy.stop()
