"""CurveZMQ on the control plane over real sockets: only admitted keys register, each only in its
roles; plain-text peers get nothing; and a tap on the wire sees no prompt text."""

from __future__ import annotations

import time

import pytest
import zmq

from bus import codec
from bus.bus_client import BusClient
from bus.endpoint import Endpoint
from bus.messages import Ready
from tests.bus.conftest import BrokerThread
from tests.bus.security_helpers import config_for, make_keys
from tests.bus.test_endpoint_sockets import echo_worker
from tests.integration.tcp_tap import TcpTap

pytestmark = pytest.mark.integration
PROMPT = "Tell me the launch codes, PROMPT-CANARY-7f3a"
REFUSED_WAIT_S = 1.5   # a refused peer never registers; this is how long we give it to try


@pytest.fixture
def keys(tmp_path):
    return make_keys(tmp_path), tmp_path


@pytest.fixture
def curve_broker(keys):
    key_pairs, key_dir = keys
    broker = BrokerThread(security=config_for(key_pairs, key_dir, "broker")).start()
    yield broker
    broker.stop()


def test_admitted_nodes_register_and_stream_over_curve(keys, curve_broker):
    key_pairs, key_dir = keys
    with Endpoint(curve_broker.endpoint, "decode", "d1",
                  security=config_for(key_pairs, key_dir, "decode")) as worker:
        assert worker.wait_registered(10)
        echo_worker(worker)
        with BusClient(curve_broker.endpoint, "g1",
                       security=config_for(key_pairs, key_dir, "gateway")) as client:
            replies = client.call_blocking("decode", {"prompt": PROMPT}, timeout=10)
    assert replies[-1].body == {"served_by": "d1"}
    assert curve_broker.broker.gatekeeper.metrics["zap.allowed"] >= 2


def test_an_unknown_key_cannot_register_or_send(keys, curve_broker):
    key_pairs, key_dir = keys
    with Endpoint(curve_broker.endpoint, "decode", "d1",
                  security=config_for(key_pairs, key_dir, "decode")) as worker:
        assert worker.wait_registered(10)
        echo_worker(worker)
        with Endpoint(curve_broker.endpoint, "gateway", "evil",
                      security=config_for(key_pairs, key_dir, "intruder")) as intruder:
            assert not intruder.wait_registered(REFUSED_WAIT_S)
            stream = intruder.request("decode", {"prompt": PROMPT}, timeout=0.5)
            with pytest.raises(TimeoutError):
                stream.collect()
    assert "evil" not in curve_broker.call(lambda: set(curve_broker.broker.core.nodes_by_id))
    assert curve_broker.call(lambda: curve_broker.broker.core.metrics["routed.request"]) == 0
    assert curve_broker.broker.gatekeeper.metrics["zap.denied"] >= 1


def test_a_plain_text_peer_cannot_talk_to_a_curve_broker(curve_broker):
    with Endpoint(curve_broker.endpoint, "decode", "plain") as plain:
        assert not plain.wait_registered(REFUSED_WAIT_S)
    # Below the Endpoint: a raw DEALER's READY never reaches the broker, nor does any answer come.
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(curve_broker.endpoint)
    dealer.send_multipart(codec.encode(Ready("decode", "raw")))
    assert dealer.poll(1000) == 0
    context.destroy(linger=0)
    assert not curve_broker.call(lambda: set(curve_broker.broker.core.nodes_by_id))


def test_a_gateway_key_cannot_register_as_a_decode_node(keys, curve_broker):
    key_pairs, key_dir = keys
    with Endpoint(curve_broker.endpoint, "decode", "fake-decode",
                  security=config_for(key_pairs, key_dir, "gateway")) as fake:
        assert not fake.wait_registered(REFUSED_WAIT_S)
    assert not curve_broker.call(lambda: set(curve_broker.broker.core.nodes_by_id))
    assert curve_broker.call(lambda: curve_broker.broker.core.metrics["dropped.forbidden"]) >= 1
    assert curve_broker.broker.gatekeeper.metrics["zap.allowed"] >= 1   # authenticated, not authorized


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
def test_a_tap_between_client_and_broker_sees_no_prompt_text(keys, curve):
    key_pairs, key_dir = keys
    security = {name: config_for(key_pairs, key_dir, name) if curve else None
                for name in ("broker", "decode", "gateway")}
    broker = BrokerThread(security=security["broker"]).start()
    tap = TcpTap(broker.endpoint)
    try:
        with Endpoint(tap.endpoint, "decode", "d1", security=security["decode"]) as worker:
            assert worker.wait_registered(10)
            echo_worker(worker)   # echoes the payload back: the prompt crosses the tap both ways
            with BusClient(tap.endpoint, "g1", security=security["gateway"]) as client:
                replies = client.call_blocking("decode", {"prompt": PROMPT}, (PROMPT.encode(),), timeout=10)
        assert replies[-1].body == {"served_by": "d1"}
        time.sleep(0.1)
        wire = bytes(tap.captured)
        assert len(wire) > 1000
        # Plain mode proves the tap sees the traffic; CURVE mode that it sees none of the text.
        assert (b"PROMPT-CANARY-7f3a" in wire) is (not curve)
        assert (b"served_by" in wire) is (not curve)
    finally:
        tap.close()
        broker.stop()


def test_a_refused_node_is_not_left_half_registered(keys, curve_broker):
    """After a forbidden READY the same socket can still not use the bus."""
    key_pairs, key_dir = keys
    with Endpoint(curve_broker.endpoint, "decode", "d1",
                  security=config_for(key_pairs, key_dir, "decode")) as worker:
        assert worker.wait_registered(10)
        with Endpoint(curve_broker.endpoint, "prefill", "p-evil",
                      security=config_for(key_pairs, key_dir, "decode")) as wrong_role:
            assert not wrong_role.wait_registered(REFUSED_WAIT_S)
            wrong_role.send_direct("d1", {"type": "kv_ready", "request_id": "x"})
            with pytest.raises(TimeoutError):
                worker.receive(timeout=0.5)
        assert curve_broker.call(lambda: set(curve_broker.broker.core.nodes_by_id)) == {"d1"}


def test_an_admitted_key_cannot_take_over_another_nodes_id(keys, curve_broker):
    """Issue #39 item 4: a gateway key registering under a decode node's id would receive its
    DIRECTs and could answer into other clients' streams; the id stays bound to its first key."""
    key_pairs, key_dir = keys
    with Endpoint(curve_broker.endpoint, "decode", "d1",
                  security=config_for(key_pairs, key_dir, "decode")) as worker:
        assert worker.wait_registered(10)
        echo_worker(worker)
        with Endpoint(curve_broker.endpoint, "gateway", "d1",
                      security=config_for(key_pairs, key_dir, "gateway")) as impostor:
            assert not impostor.wait_registered(REFUSED_WAIT_S)
        node = curve_broker.call(lambda: curve_broker.broker.core.nodes_by_id["d1"])
        assert node.role == "decode"
        assert curve_broker.call(lambda: curve_broker.broker.core.metrics["dropped.forbidden"]) >= 1
        with BusClient(curve_broker.endpoint, "g1",
                       security=config_for(key_pairs, key_dir, "gateway")) as client:
            replies = client.call_blocking("decode", {"prompt": PROMPT}, timeout=10)
    assert replies[-1].body == {"served_by": "d1"}
