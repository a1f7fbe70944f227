"""A real `NodeLoop` with its `NodeControl` (tiny engine, a recording endpoint, no sockets): a CONTROL
drain refuses new work, lets running streams finish and stops the loop; past the deadline the
streams are handed over with ERROR `draining`; a switchable node flips role with its engine kept,
reports the new role's capacity and serves it; bad or senseless commands are refused; SIGTERM
drains and a second one stops at once."""

from __future__ import annotations

import threading
import time

import pytest

from bus.messages import Control
from nodes.colocated_node import node_works
from nodes.node_control import NodeControl
from nodes.node_lifecycle import Lifecycle
from nodes.runtime import NodeLoop
from tests.nodes import test_prefill_node as prefill_tests
from tests.nodes.cluster_fakes import FakeEndpoint, tiny_engine, tiny_settings
from tests.nodes.test_decode_node import request


class ControlledNode:
    """`node_works(kind)` on one tiny engine, served by a NodeLoop with a NodeControl on a thread."""

    def __init__(self, kv_thread, kind="decode", role="decode", *, switchable=False, drain_timeout_s=30.0,
                 step_delay_s=0.0) -> None:
        self.endpoint = FakeEndpoint("node-a")
        settings = tiny_settings(role, step_delay_s=step_delay_s)
        self.works = node_works(kind, settings, tiny_engine(), kv_thread)
        for work in self.works:
            work.attach(self.endpoint)
        self.control = NodeControl(self.endpoint, self.works,
                                   Lifecycle(role, switchable=switchable, drain_timeout_s=drain_timeout_s))
        self.stop = threading.Event()
        self.loop = NodeLoop(self.endpoint, self.works, self.stop, self.control)
        self.control.publish_now = self.loop.publish_now
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()

    def post(self, *messages) -> None:
        for message in messages:
            self.endpoint.inbox.put(message)

    def wait_for(self, kind: str, request_id: str | None, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while not (found := self.endpoint.of(kind, request_id)):
            assert time.monotonic() < deadline, f"no {kind} for {request_id}"
            time.sleep(0.005)
        return found

    def wait_stopped(self, timeout: float = 10.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the node did not leave"

    def capacities(self) -> list[dict]:
        return self.endpoint.of("capacity")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def nodes():
    made: list[ControlledNode] = []
    yield made
    for node in made:
        node.close()


def test_a_drain_refuses_new_work_finishes_running_streams_then_leaves(kv_thread, nodes):
    node = ControlledNode(kv_thread, step_delay_s=0.05)
    nodes.append(node)
    node.post(request("r1", prefill="local"))
    node.wait_for("partial", "r1")
    node.post(Control("planner", {"action": "drain"}), request("r2", prefill="local"))
    error = node.wait_for("error", "r2")[0]
    assert error["code"] == "draining" and error["node_id"] == "node-a"
    assert any(c.get("draining") == 1 for c in node.capacities())   # the policy stops routing here
    node.wait_stopped()
    assert len(node.wait_for("final", "r1")[0]["tokens"]) >= 1 and not node.endpoint.of("error", "r1")


def test_past_the_drain_deadline_running_streams_are_handed_over(kv_thread, nodes):
    node = ControlledNode(kv_thread, drain_timeout_s=0.2, step_delay_s=0.2)
    nodes.append(node)
    node.post(request("r1", prefill="local", sampling={"temperature": 0.0, "max_tokens": 200, "ignore_eos": True}))
    node.wait_for("partial", "r1")
    node.post(Control("planner", {"action": "drain"}))
    node.wait_stopped()
    assert node.wait_for("error", "r1")[0]["code"] == "draining" and not node.endpoint.of("final", "r1")
    assert not node.works[0].jobs and not node.works[0].engine.running   # its KV was freed


def test_a_switchable_node_becomes_a_prefill_node_with_its_engine_kept(kv_thread, nodes):
    node = ControlledNode(kv_thread, kind="switchable", switchable=True)
    nodes.append(node)
    decode_engine = node.works[0].engine
    node.post(Control("planner", {"action": "role", "role": "prefill"}))
    node.wait_for("ready", "prefill")
    capacity = node.capacities()[-1]
    assert "max_batch_tokens" in capacity and "kv_blocks_total" not in capacity
    assert capacity["switchable"] == 1 and capacity["role_switches"] == 1 and "draining" not in capacity
    node.post(prefill_tests.request("p1"), request("late-decode", prefill="local"))
    assert node.wait_for("partial", "p1")   # the first token: it prefills now
    assert node.wait_for("error", "late-decode")[0]["code"] == "draining"   # routed before the switch
    assert node.works[1].engine is decode_engine and node.thread.is_alive()


@pytest.mark.parametrize("body, reason", [
    ({"action": "role", "role": "prefill"}, "switchable"),   # not started with --switchable
    ({"action": "explode"}, "action"),
    ({"action": "role", "role": "gateway"}, "role"),
])
def test_commands_that_cannot_be_carried_out_are_refused_and_counted(kv_thread, nodes, body, reason):
    node = ControlledNode(kv_thread)
    nodes.append(node)
    node.post(Control("planner", body), request("r1", prefill="local"))
    node.wait_for("final", "r1")   # still serving
    assert node.control.counters["control.refused"] == 1 and not node.control.lifecycle.draining


def test_sigterm_drains_and_a_second_sigterm_stops_at_once(kv_thread, nodes):
    node = ControlledNode(kv_thread, step_delay_s=0.2)
    nodes.append(node)
    node.post(request("r1", prefill="local", sampling={"temperature": 0.0, "max_tokens": 500, "ignore_eos": True}))
    node.wait_for("partial", "r1")
    node.control.terminate()
    deadline = time.monotonic() + 5
    while not node.control.lifecycle.draining:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert node.thread.is_alive()   # a stream still runs
    node.control.terminate()
    node.wait_stopped()
