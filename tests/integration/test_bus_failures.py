"""Real broker and node processes over loopback TCP: a killed node is reported dead as soon as
its connection closes (before the liveness window), a frozen idle node within the idle window
(measured by the broker itself; a frozen node with work: tests/integration/test_cluster_failover.py), a thawed node
re-registers cleanly, a restarted broker gets its idle nodes back within one idle interval,
and garbage at the broker's port does not stop it serving.
Waits poll with generous deadlines (the machine is shared); the timing claims are checked on
the broker's own measurements (silent_for_s, its log timestamps), not on the test's sleeps."""

from __future__ import annotations

import signal
import socket
import time

import pytest
import zmq

from bus import codec
from bus.bus_client import BusClient
from bus.constants import Command
from bus.liveness import HeartbeatConfig
from bus.mailbox import BusError
from tests.bus.processes import free_port, python_process, start_broker, start_node, timestamp

pytestmark = pytest.mark.integration
WINDOW_S = HeartbeatConfig().expiry_s          # 250 ms x 3
DETECTION_LIMIT_S = 1.0                        # the claim: a dead peer, or a frozen one with work, in under 1 s
IDLE_LIMIT_S = HeartbeatConfig().idle_expiry_s + 0.25   # a frozen idle node: 1 s x 3, plus a tick and slack
IDLE_REJOIN_S = HeartbeatConfig().idle_interval_s + 0.25   # an idle node's next heartbeat, plus a reconnect


@pytest.fixture
def port():
    return free_port()


@pytest.fixture
def processes():
    started = []
    yield started
    for process in reversed(started):
        process.stop()


def test_sigkill_node_is_reported_dead_within_the_window(port, processes):
    broker = start_broker(port)
    node = start_node(port, "decode", "victim")
    processes += [broker, node]
    broker.wait_for("node_joined", node_id="victim")
    node.signal(signal.SIGKILL)
    left = broker.wait_for("node_left", node_id="victim")
    # Its TCP connection closed: the broker's probe finds it gone before the liveness window.
    assert left["reason"] == "connection_lost"
    assert left["silent_for_s"] < WINDOW_S


STALLING_NODE = """
import sys, time
from bus.endpoint import Endpoint
from bus.log import configure_logging, get_logger
configure_logging("json", "info")
endpoint = Endpoint(sys.argv[1], "decode", "staller").start()
while True:
    request = endpoint.receive()
    endpoint.reply(request.request_id, {"token": 1})
    get_logger("staller").info("replied_once")
"""


def test_client_is_told_when_the_node_serving_its_stream_is_killed(port, processes):
    broker = start_broker(port)
    node = python_process(STALLING_NODE, f"tcp://127.0.0.1:{port}")
    processes += [broker, node]
    broker.wait_for("node_joined", node_id="staller")
    with BusClient(f"tcp://127.0.0.1:{port}", "waiting-client") as client:
        stream = client.stream("decode", {"prompt": "x"}, timeout=15)
        assert next(stream).seq == 0
        node.signal(signal.SIGKILL)
        with pytest.raises(BusError) as info:
            next(stream)
    assert info.value.code == "node_lost"
    assert info.value.details == {"node_id": "staller", "num_replies": 1}


def test_sigstop_node_is_reported_dead_then_reregisters_on_sigcont(port, processes):
    broker = start_broker(port)
    node = start_node(port, "prefill", "sleeper")
    processes += [broker, node]
    broker.wait_for("node_joined", node_id="sleeper")
    node.signal(signal.SIGSTOP)
    left = broker.wait_for("node_left", node_id="sleeper")
    # Idle (no request): judged by the idle window (PROTOCOL.md §1.4).
    assert left["reason"] == "expired" and HeartbeatConfig().idle_expiry_s < left["silent_for_s"] < IDLE_LIMIT_S
    node.signal(signal.SIGCONT)
    broker.wait_for("node_joined", node_id="sleeper", count=2)
    node.wait_for("registered", count=2)
    with BusClient(f"tcp://127.0.0.1:{port}", "checker") as client:
        replies = client.call_blocking("prefill", {"ping": 1}, timeout=15)
    assert replies[-1].body == {"node_id": "sleeper"}
    assert len(broker.find("node_left", node_id="sleeper")) == 1   # no flapping afterwards


def test_a_frozen_node_with_a_request_is_reported_dead_within_a_second_after_idling(port, processes):
    broker = start_broker(port)
    node = python_process(STALLING_NODE, f"tcp://127.0.0.1:{port}")
    processes += [broker, node]
    broker.wait_for("node_joined", node_id="staller")
    time.sleep(2 * WINDOW_S)   # idle: heartbeating every second, longer than the short window
    with BusClient(f"tcp://127.0.0.1:{port}", "waiting-client") as client:
        stream = client.stream("decode", {"prompt": "x"}, timeout=15)
        assert next(stream).seq == 0   # it has a request now: back to the short interval
        node.wait_for("replied_once")
        node.signal(signal.SIGSTOP)
        with pytest.raises(BusError) as info:
            next(stream)
    node.signal(signal.SIGCONT)
    assert info.value.code == "node_lost"
    left = broker.wait_for("node_left", node_id="staller")
    assert left["reason"] == "expired" and left["silent_for_s"] < DETECTION_LIMIT_S


def test_restarted_broker_gets_its_idle_nodes_back_within_one_idle_interval(port, processes):
    broker = start_broker(port)
    nodes = [start_node(port, role, f"{role}-1") for role in ("prefill", "decode", "both")]
    processes += nodes
    for node in nodes:
        broker.wait_for("node_joined", node_id=node.args[node.args.index("--node-id") + 1])
    broker.signal(signal.SIGKILL)
    broker.process.wait(5)
    restarted = start_broker(port)
    processes.append(restarted)
    started = timestamp(restarted.wait_for("broker_started"))
    for role in ("prefill", "decode", "both"):
        joined = restarted.wait_for("node_joined", node_id=f"{role}-1")
        # Idle nodes: their next heartbeat (within the idle interval) meets DISCONNECT
        # not_registered and they register again at once (PROTOCOL.md §1.4, §1.6).
        assert timestamp(joined) - started < IDLE_REJOIN_S, f"{role}-1 re-registered late"
    with BusClient(f"tcp://127.0.0.1:{port}", "checker") as client:
        assert client.call_blocking("decode", timeout=15)[-1].body["node_id"] in {"decode-1", "both-1"}


def test_nodes_backing_off_during_a_long_outage_rejoin_within_one_window(port, processes):
    broker = start_broker(port)
    node = start_node(port, "decode", "patient")
    processes.append(node)
    broker.wait_for("node_joined", node_id="patient")
    broker.signal(signal.SIGKILL)
    broker.process.wait(5)
    node.wait_for("broker_lost")
    time.sleep(2.5)   # the outage: several reconnect attempts, the back-off growing
    restarted = start_broker(port)
    processes.append(restarted)
    started = timestamp(restarted.wait_for("broker_started"))
    joined = timestamp(restarted.wait_for("node_joined", node_id="patient"))
    assert joined - started < WINDOW_S


def test_garbage_at_the_broker_port_does_not_stop_it(port, processes):
    broker = start_broker(port)
    node = start_node(port, "decode", "steady")
    processes += [broker, node]
    broker.wait_for("node_joined", node_id="steady")
    for blob in (b"\x00" * 1024, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", bytes(range(256)) * 64,
                 b"\xff" + b"\x00" * 7 + b"\x7f" + b"\xff" * 8):   # a ZMTP greeting start, then lies
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(blob)
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    rogue.connect(f"tcp://127.0.0.1:{port}")
    rogue.send_multipart([codec.HEADERS[Command.REQUEST], b"truncated"])
    rogue.send_multipart([b"PDB\x63\x01", b"future version"])
    assert rogue.poll(10_000) and codec.decode(rogue.recv_multipart()).reason == "malformed"
    rogue.close(linger=0)
    broker.wait_for("message_rejected", reason="bad_version")
    with BusClient(f"tcp://127.0.0.1:{port}", "checker") as client:
        assert client.call_blocking("decode", {"still": "here"}, timeout=15)[-1].body == {"node_id": "steady"}
    assert broker.process.poll() is None and not broker.find("node_left", node_id="steady")
