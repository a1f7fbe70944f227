"""bus.reactor.queued_messages: what is already queued on a socket, taken without blocking."""

from __future__ import annotations

import time

import pytest
import zmq

from bus.reactor import queued_messages


@pytest.fixture
def pair():
    context = zmq.Context.instance()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield pull, push
    push.close(linger=0)
    pull.close(linger=0)


def _queue(pull, push, count: int) -> None:
    for number in range(count):
        push.send_multipart([b"m", str(number).encode()])
    deadline = time.monotonic() + 5
    while not pull.poll(10) and time.monotonic() < deadline:   # the first has arrived
        pass
    time.sleep(0.05)   # and the rest behind it (loopback TCP)


def test_an_empty_socket_yields_nothing_and_does_not_block(pair):
    pull, _ = pair
    assert list(queued_messages(pull)) == []


def test_every_queued_message_comes_in_order_and_then_it_stops(pair):
    pull, push = pair
    _queue(pull, push, 10)
    assert [frames[1] for frames in queued_messages(pull)] == [str(n).encode() for n in range(10)]
    assert list(queued_messages(pull)) == []


def test_a_limit_takes_that_many_and_leaves_the_rest_queued(pair):
    pull, push = pair
    _queue(pull, push, 10)
    first = list(queued_messages(pull, 4, copy=False))
    assert [frames[1].bytes for frames in first] == [b"0", b"1", b"2", b"3"]   # zero-copy frames
    assert [frames[1] for frames in queued_messages(pull)] == [str(n).encode() for n in range(4, 10)]
