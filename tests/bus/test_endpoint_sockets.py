"""Endpoint and BusClient against a real broker over loopback TCP (in-process threads):
streams with zero-copy payloads, the async API, direct messages, cancellation, capacity, node
loss seen by the client, broker restart, and garbage on the broker's socket."""

from __future__ import annotations

import socket
import threading

import pytest
import zmq

from bus import codec
from bus import constants as c
from bus.broker_tables import NodeLeft
from bus.bus_client import BusClient
from bus.endpoint import Endpoint
from bus.mailbox import BusError
from bus.messages import Cancel, Direct, Final, Request
from tests.bus.conftest import BrokerThread, wait_until

pytestmark = pytest.mark.integration


def echo_worker(endpoint: Endpoint, num_partials: int = 2) -> threading.Thread:
    def serve() -> None:
        while True:
            try:
                message = endpoint.receive(timeout=0.1)
            except TimeoutError:
                if not endpoint._thread.is_alive():
                    return
                continue
            if isinstance(message, Request):
                for i in range(num_partials):
                    endpoint.reply(message.request_id, {"i": i}, message.payload)
                endpoint.reply_final(message.request_id, {"served_by": endpoint.node_id})
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def worker(broker_thread):
    with Endpoint(broker_thread.endpoint, "decode", "d1", capacity={"kv_blocks_free": 4}) as endpoint:
        assert endpoint.wait_registered(10)
        echo_worker(endpoint)
        yield endpoint


@pytest.fixture
def client(broker_thread):
    with BusClient(broker_thread.endpoint, "g1") as bus_client:
        yield bus_client


def test_stream_with_a_large_payload_round_trips(worker, client):
    payload = bytes(range(256)) * 4096   # 1 MiB, travels as its own frame
    replies = client.call_blocking("decode", {"prompt": "hi"}, (memoryview(payload),), timeout=10)
    assert [type(r).__name__ for r in replies] == ["Partial", "Partial", "Final"]
    assert [r.seq for r in replies] == [0, 1, 2] and replies[-1].body == {"served_by": "d1"}
    assert bytes(replies[0].payload[0]) == payload


async def test_async_stream(worker, client):
    bodies = [reply.body async for reply in client.stream("decode", {"x": 1}, timeout=10)]
    assert bodies == [{"i": 0}, {"i": 1}, {"served_by": "d1"}]


async def test_no_node_is_a_bus_error(client):
    with pytest.raises(BusError) as info:
        await client.call("prefill", timeout=10)
    assert info.value.code == c.ErrorCode.NO_NODE


def test_direct_message_and_capacity_update(broker_thread):
    with Endpoint(broker_thread.endpoint, "prefill", "p1") as sender, \
            Endpoint(broker_thread.endpoint, "decode", "d9") as receiver:
        assert sender.wait_registered(10) and receiver.wait_registered(10)
        sender.send_direct("d9", {"kv": "here"}, (b"blob",))
        message = receiver.receive(timeout=10)
        assert isinstance(message, Direct) and (message.peer, bytes(message.payload[0])) == ("p1", b"blob")
        receiver.update_capacity({"kv_blocks_free": 3})
        wait_until(lambda: broker_thread.call(lambda: broker_thread.broker.core.nodes_by_id["d9"].capacity)
                   == {"kv_blocks_free": 3})


def test_cancel_reaches_the_serving_node(broker_thread, client):
    with Endpoint(broker_thread.endpoint, "decode", "slow") as slow:
        assert slow.wait_registered(10)
        stream = client.stream("decode", timeout=10)
        request = slow.receive(timeout=10)
        stream.cancel()
        assert slow.receive(timeout=10) == Cancel(request.request_id, c.CancelReason.CLIENT)


def test_client_learns_that_its_node_died(broker_thread, client):
    slow = Endpoint(broker_thread.endpoint, "decode", "doomed").start()
    assert slow.wait_registered(10)
    stream = client.stream("decode", timeout=10)
    request = slow.receive(timeout=10)
    slow.reply(request.request_id, "first")
    assert next(stream).body == "first"
    slow.stop()
    with pytest.raises(BusError) as info:
        next(stream)
    assert info.value.code == c.ErrorCode.NODE_LOST
    assert info.value.details == {"node_id": "doomed", "num_replies": 1}


def test_broker_restart_nodes_reregister_and_streams_continue(broker_thread):
    first = broker_thread
    with Endpoint(first.endpoint, "decode", "d1") as node, BusClient(first.endpoint, "g1") as client:
        assert node.wait_registered(10)
        stream = client.stream("decode", timeout=10)
        request = node.receive(timeout=10)
        node.reply(request.request_id, "before")
        assert next(stream).body == "before"
        first.stop()
        wait_until(lambda: not node.registered)
        second = BrokerThread(first.endpoint).start()
        try:
            wait_until(lambda: second.call(lambda: {"d1", "g1"} <= set(second.broker.core.nodes_by_id)))
            node.reply_final(request.request_id, "after")
            final = next(stream)
            assert (type(final), final.seq, final.body) == (Final, 1, "after")
        finally:
            second.stop()


def test_garbage_on_the_wire_does_not_stop_the_broker(broker_thread, worker, client):
    host, port = broker_thread.endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)))
    context = zmq.Context.instance()
    rogue = context.socket(zmq.DEALER)
    rogue.connect(broker_thread.endpoint)
    for frames in ([b"hello"], [b"PDB\x09\x02"], [codec.HEADERS[c.Command.READY], b"\xc1"]):
        rogue.send_multipart(frames)
        assert rogue.poll(10_000), "the rogue peer gets an answer"
        assert codec.decode(rogue.recv_multipart()).__class__.__name__ == "Disconnect"
    rogue.close(linger=0)
    assert client.call_blocking("decode", timeout=10)[-1].body == {"served_by": "d1"}
    metrics = broker_thread.call(lambda: dict(broker_thread.broker.core.metrics))
    assert metrics["dropped.malformed"] == 2 and metrics["dropped.bad_version"] == 1
    assert not [e for e in broker_thread.events if isinstance(e, NodeLeft)]
