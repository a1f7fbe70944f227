"""A real `pdbus broker` process running the ClusterPolicy from [scheduler], with decode node
processes that report full: the client gets ERROR `overloaded` with `retry_after_s` (queue full
at once, or after the queue timeout), and a queued request is served once capacity frees."""

from __future__ import annotations

import time

import pytest

from bus.bus_client import BusClient
from bus.mailbox import BusError
from tests.bus.processes import LoggedProcess, free_port, pdbus, python_process

pytestmark = pytest.mark.integration

QUEUE_TIMEOUT_S, RETRY_AFTER_S = 1.5, 0.5

# A decode node that reports a full KV budget until the file argv[3] exists, then frees it.
FULL_NODE = """
import os, sys, time
from bus.endpoint import Endpoint
from bus.log import configure_logging, get_logger
configure_logging("json", "info")
full = {"kv_blocks_total": 64, "kv_blocks_free": 0, "max_running": 4, "num_running": 0}
endpoint = Endpoint(sys.argv[1], "decode", sys.argv[2], capacity=full).start()
log = get_logger("full_node")
freed = False
while True:
    if not freed and os.path.exists(sys.argv[3]):
        endpoint.update_capacity({**full, "kv_blocks_free": 32})
        freed = True
        log.info("capacity_freed")
    try:
        request = endpoint.receive(timeout=0.05)
    except TimeoutError:
        continue
    endpoint.reply_final(request.request_id, {"node_id": sys.argv[2]})
"""


@pytest.fixture
def cluster(tmp_path):
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    broker = LoggedProcess(pdbus("broker", "--endpoint", endpoint), env={
        "PDBUS__SCHEDULER__QUEUE_SIZE": "1", "PDBUS__SCHEDULER__QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
        "PDBUS__SCHEDULER__RETRY_AFTER_S": str(RETRY_AFTER_S)})
    processes = [broker]
    try:
        broker.wait_for("broker_started")
        flags = {name: tmp_path / f"{name}.free" for name in ("full-a", "full-b")}
        for name, flag in flags.items():
            processes.append(python_process(FULL_NODE, endpoint, name, str(flag)))
            broker.wait_for("node_joined", node_id=name)
        yield endpoint, flags, processes
    finally:
        for process in processes:
            process.stop()


def test_every_decode_node_full_is_answered_overloaded_with_a_retry_hint(cluster):
    endpoint, _, processes = cluster
    with BusClient(endpoint) as client:
        waiting = client.stream("decode", {"prompt": "x"}, key="chat-1", timeout=15)
        queued_at = time.monotonic()
        with pytest.raises(BusError) as at_once:        # the queue (1 place) is taken
            client.call_blocking("decode", {"prompt": "y"}, key="chat-2", timeout=15)
        assert (at_once.value.code, at_once.value.details) == ("overloaded", {"retry_after_s": RETRY_AFTER_S})
        with pytest.raises(BusError) as timed_out:
            next(waiting)
        waited = time.monotonic() - queued_at
    assert (timed_out.value.code, timed_out.value.details) == ("overloaded", {"retry_after_s": RETRY_AFTER_S})
    assert QUEUE_TIMEOUT_S - 0.1 <= waited < QUEUE_TIMEOUT_S + 5
    processes[0].stop()
    stopped = processes[0].wait_for("broker_stopped")
    assert stopped["metrics"]["queue.timed_out"] == 1 and stopped["metrics"]["rejected.overloaded"] == 2
    assert stopped["policy_metrics"]["decode.all_full"] >= 2


def test_a_queued_request_is_served_when_a_node_frees_capacity(cluster):
    endpoint, flags, processes = cluster
    with BusClient(endpoint) as client:
        waiting = client.stream("decode", {"prompt": "x"}, key="chat-1", timeout=15)
        time.sleep(0.3)                                 # queued, well before its timeout
        flags["full-b"].touch()
        final = next(waiting)
    assert final.body == {"node_id": "full-b"}
    processes[0].stop()
    metrics = processes[0].wait_for("broker_stopped")["metrics"]
    assert (metrics["queue.deferred"], metrics["queue.dispatched"]) == (1, 1)
