"""The node loop never dies of one request (issue #39): a hostile `kv_ready` DIRECT is dropped and
counted at arrival; a handler, a token or an engine step that raises fails the requests it
concerns with ERROR `internal` and frees their KV; a body nested thousands of levels deep is logged
as a bounded summary. A real `NodeLoop` on a thread, the tiny engine, a recording endpoint."""

from __future__ import annotations

import threading
import time

import pytest

from bus.kv import TransferResult
from bus.kv.layout import KVInfo
from bus.kv.stats import TransferStats
from bus.messages import Direct, Request
from nodes import wire
from nodes.colocated_node import node_works
from nodes.decode_node import KvArrived
from nodes.runtime import NodeLoop
from tests.nodes import test_prefill_node as prefill_tests
from tests.nodes.cluster_fakes import FakeEndpoint, tiny_engine, tiny_settings
from tests.nodes.test_decode_node import GREEDY, PROMPT, make_work, prefilled, request

MISSING = object()


class Served:
    """A NodeLoop serving `works` on its own thread; messages posted before `start` are taken together."""

    def __init__(self, works, endpoint) -> None:
        self.endpoint, self.stop = endpoint, threading.Event()
        self.loop = NodeLoop(endpoint, works, self.stop)
        self.thread = threading.Thread(target=self.loop.run, name="node-loop-test", daemon=True)

    def start(self) -> Served:
        self.thread.start()
        return self

    def post(self, *messages) -> None:
        for message in messages:
            self.endpoint.inbox.put(message)

    def wait_for(self, kind: str, request_id: str, timeout: float = 20.0) -> list:
        deadline = time.monotonic() + timeout
        while not (found := self.endpoint.of(kind, request_id)):
            assert self.thread.is_alive(), "the node loop died"
            assert time.monotonic() < deadline, f"no {kind} for {request_id}"
            time.sleep(0.005)
        return found

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@pytest.fixture
def decode_node(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    served = Served([work], endpoint)
    yield work, served
    served.close()


def land_kv(work, transfer_id: str, request_id: str, fill: float | None = None) -> int:
    """What the KV thread does for a verified transfer; the first token the prefill node sampled."""
    kv, first_token_id = prefilled(PROMPT)
    dst = work.kv.allocate(transfer_id, request_id, KVInfo(tuple(kv.shape), "float32"), "int8")
    dst.copy_(kv if fill is None else kv.fill_(fill))
    stats = TransferStats(transfer_id, request_id, raw_bytes=kv.nbytes)
    work.endpoint.inbox.put(KvArrived(TransferResult(transfer_id, request_id, True, dst, 0, "", stats)))
    return first_token_id


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


HOSTILE_KV_READY = {
    "outside the vocabulary": {"first_token_id": 10**6},
    "negative": {"first_token_id": -1},
    "beyond 64 bits": {"first_token_id": 2**70},
    "a float": {"first_token_id": 3.5},
    "a string": {"first_token_id": "7"},
    "a bool": {"first_token_id": True},
    "missing": {"first_token_id": MISSING},
    "request id a list": {"request_id": ["r1"]},
    "request id missing": {"request_id": MISSING},
    "transfer id a number": {"transfer_id": 7},
    "transfer id nested deep": {"transfer_id": deep(5000)},
}


@pytest.mark.parametrize("change", HOSTILE_KV_READY.values(), ids=HOSTILE_KV_READY.keys())
def test_a_hostile_kv_ready_is_dropped_counted_and_the_node_serves_on(decode_node, change):
    work, served = decode_node
    served.start().post(request("r1"))
    transfer_id = served.wait_for("partial", "r1")[0]["transfer_id"]
    first_token_id = land_kv(work, transfer_id, "r1")
    body = wire.to_wire(wire.KvReadyBody("r1", transfer_id, first_token_id)) | change
    served.post(Direct("prefill-0", {k: v for k, v in body.items() if v is not MISSING}))
    served.post(request("r2", prefill="local"))
    served.wait_for("final", "r2")
    assert served.endpoint.of("partial", "r1")[1:] == [] and not served.endpoint.of("error", "r1")
    assert work.counters["kv_ready.malformed"] == 1
    served.post(Direct("prefill-0", wire.to_wire(wire.KvReadyBody("r1", transfer_id, first_token_id))))   # the real one
    served.wait_for("final", "r1")
    assert served.thread.is_alive()


def test_verified_kv_full_of_nan_ends_its_request_not_the_node(decode_node):
    """A prefill-role peer's KV passes every check but its values: the engine's step may raise on it
    (the f32 attention divides by a zero softmax sum). That request ends; the node serves on."""
    work, served = decode_node
    served.start().post(request("r1"))
    transfer_id = served.wait_for("partial", "r1")[0]["transfer_id"]
    first_token_id = land_kv(work, transfer_id, "r1", fill=float("nan"))
    served.post(Direct("prefill-0", wire.to_wire(wire.KvReadyBody("r1", transfer_id, first_token_id))))
    deadline = time.monotonic() + 20
    while not (ended := served.endpoint.of("error", "r1") + served.endpoint.of("final", "r1")):
        assert served.thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.005)
    assert ended[0].get("code", "internal") == "internal"
    served.post(request("r2", prefill="local"))
    served.wait_for("final", "r2")
    assert not work.jobs and not work.engine.running


def test_unsound_kv_ends_only_its_request_and_its_batch_mates_stream_on(decode_node):
    """The engine names the request whose KV is not finite; a healthy stream in the same
    batch keeps its tokens and finishes (before: every request in the step ended `internal`)."""
    work, served = decode_node
    long = {**GREEDY, "max_tokens": 200, "ignore_eos": True}
    served.start().post(request("healthy", prefill="local", sampling=long), request("r1"))
    transfer_id = served.wait_for("partial", "r1")[0]["transfer_id"]
    served.wait_for("partial", "healthy")
    first_token_id = land_kv(work, transfer_id, "r1", fill=float("nan"))
    served.post(Direct("prefill-0", wire.to_wire(wire.KvReadyBody("r1", transfer_id, first_token_id))))
    assert served.wait_for("error", "r1")[0]["code"] == "internal"
    final = served.wait_for("final", "healthy", timeout=60)[0]
    assert final["finish_reason"] == "length" and not served.endpoint.of("error", "healthy")
    assert work.counters["step.failed"] >= 1


class FailingOnce:
    """Stands in for a method: raises the first time it is called, then calls the real one."""

    def __init__(self, method) -> None:
        self.method, self.num_calls = method, 0

    def __call__(self, *args, **kwargs):
        self.num_calls += 1
        if self.num_calls == 1:
            raise RuntimeError("injected failure")
        return self.method(*args, **kwargs)


def test_an_engine_step_that_raises_fails_its_requests_frees_their_kv_and_the_node_serves_on(decode_node):
    work, served = decode_node
    free = work.capacity()["kv_blocks_free"]
    work.engine.step = FailingOnce(work.engine.step)
    served.post(request("r1", prefill="local"), request("r2", prefill="local"))   # both in the failing step
    served.start()
    for request_id in ("r1", "r2"):
        assert served.wait_for("error", request_id)[0]["code"] == "internal"
    served.post(request("r3", prefill="local"))
    served.wait_for("final", "r3")
    assert work.counters["step.failed"] == 1 and not work.jobs and not work.engine.running
    assert work.capacity()["kv_blocks_free"] == free


class RefusingEndpoint(FakeEndpoint):
    """A FakeEndpoint whose `reply` (and `reply_batch`) raises for one request's bodies of one type."""

    def __init__(self, request_id: str, body_type: str) -> None:
        super().__init__()
        self.refused = (request_id, body_type)

    def reply(self, request_id, body=None, payload=()):
        if (request_id, (body or {}).get("type")) == self.refused:
            raise RuntimeError("injected failure")
        super().reply(request_id, body, payload)

    def reply_batch(self, items):
        if any((request_id, (body or {}).get("type")) == self.refused for request_id, body in items):
            raise RuntimeError("injected failure")
        super().reply_batch(items)


def node_with(endpoint, kv_thread, *, role="decode"):
    works = node_works(role, tiny_settings(role), tiny_engine(), kv_thread)
    for work in works:
        work.attach(endpoint)
    return works, Served(works, endpoint)


def test_a_token_that_cannot_be_sent_fails_only_its_request(kv_thread):
    (work,), served = node_with(RefusingEndpoint("r1", "token"), kv_thread)
    served.post(request("r1", prefill="local"), request("r2", prefill="local"))
    served.start()
    assert served.wait_for("error", "r1")[0]["code"] == "internal"
    final = served.wait_for("final", "r2")[0]
    assert len(final["tokens"]) == 6 and not served.endpoint.of("final", "r1")
    assert not work.jobs and not work.engine.running
    served.close()


def test_a_handler_that_raises_fails_its_request_and_frees_the_blocks_it_reserved(kv_thread):
    (work,), served = node_with(RefusingEndpoint("r1", "plan"), kv_thread)
    free = work.capacity()["kv_blocks_free"]
    served.start().post(request("r1"))   # remote: blocks reserved, then sending the plan fails
    assert served.wait_for("error", "r1")[0]["code"] == "internal"
    served.post(request("r2", prefill="local"))
    served.wait_for("final", "r2")
    assert not work.jobs and work.capacity()["kv_blocks_free"] == free
    served.close()


def test_bodies_nested_thousands_of_levels_deep_are_logged_as_summaries_never_repr(decode_node):
    _, served = decode_node
    served.start().post(
        Direct("prefill-0", deep(5000)),                                              # not ours: logged
        Request("decode", "r1", {"prompt_token_ids": PROMPT, "session_id": deep(5000)}),
        Request("decode", "r2", {"prompt_token_ids": PROMPT, "sampling": {"stop": deep(5000)}}),
        Request("no-such-service", "r3", deep(5000)),
        request("r4", prefill="local"))
    served.wait_for("final", "r4")
    assert [served.endpoint.of("error", r)[0]["code"] for r in ("r1", "r2", "r3")] == ["bad_request"] * 3


class BrokenWork:
    """A Work whose turn always raises: the loop logs it and keeps serving the others."""

    def prepare(self): return ""
    def attach(self, endpoint): pass
    def on_message(self, message): return False
    def work(self, now): raise RuntimeError("injected failure")
    def next_deadline(self): return None
    def capacity(self): return {}
    def on_idle(self): pass
    def close(self): pass


def test_a_work_whose_turn_raises_does_not_end_the_loop(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    served = Served([BrokenWork(), work], endpoint).start()
    served.post(request("r1", prefill="local"))
    served.wait_for("final", "r1")
    assert served.loop.counters["work.failed"] >= 1
    served.close()


def test_a_prefill_pass_that_raises_fails_its_prompts_and_the_next_is_served(kv_thread):
    endpoint = FakeEndpoint("prefill-a")
    (work,), served = node_with(endpoint, kv_thread, role="prefill")
    prefill_tests.keep_sends(work)
    work.engine.start_prefill = FailingOnce(work.engine.start_prefill)
    served.start().post(prefill_tests.request("p1"))
    assert served.wait_for("error", "p1")[0]["code"] == "internal"
    served.post(prefill_tests.request("p2", transfer_id="t2"))
    assert served.wait_for("partial", "p2")[0]["type"] == "token"
    assert not work.passes and work.counters["pass.failed"] == 1
    served.close()


def test_a_prefill_chunk_that_raises_fails_its_prompts_and_the_next_is_served(kv_thread):
    endpoint = FakeEndpoint("prefill-a")
    (work,), served = node_with(endpoint, kv_thread, role="prefill")
    prefill_tests.keep_sends(work)
    start_prefill = work.engine.start_prefill

    def failing_pass(*args, **kwargs):
        running = start_prefill(*args, **kwargs)
        running.step = FailingOnce(running.step)
        return running
    work.engine.start_prefill = failing_pass
    served.post(prefill_tests.request("p1"), prefill_tests.request("p2", transfer_id="t2"))   # one pass
    served.start()
    assert [served.wait_for("error", p)[0]["code"] for p in ("p1", "p2")] == ["internal"] * 2
    work.engine.start_prefill = start_prefill
    served.post(prefill_tests.request("p3", transfer_id="t3"))
    served.wait_for("partial", "p3")
    assert not work.jobs or set(work.jobs) == {"p3"}
    served.close()


def test_a_first_token_that_cannot_be_sent_fails_only_its_prefill(kv_thread):
    endpoint = RefusingEndpoint("p1", "token")
    endpoint.node_id = "prefill-a"
    (work,), served = node_with(endpoint, kv_thread, role="prefill")
    sent = prefill_tests.keep_sends(work)
    served.post(prefill_tests.request("p1"), prefill_tests.request("p2", transfer_id="t2"))   # one pass
    served.start()
    assert served.wait_for("error", "p1")[0]["code"] == "internal"
    served.wait_for("partial", "p2")
    assert "p1" not in work.jobs and "p1" not in sent
    served.close()


def test_a_colocated_node_survives_a_failing_step_and_serves_both_services(kv_thread):
    endpoint = FakeEndpoint()
    works, served = node_with(endpoint, kv_thread, role="both")
    decode, prefill = works
    prefill_tests.keep_sends(prefill)
    decode.engine.step = FailingOnce(decode.engine.step)
    served.post(request("r1"))   # a colocated node plans every decode request local
    served.start()
    assert served.wait_for("error", "r1")[0]["code"] == "internal"
    served.post(prefill_tests.request("p1"), request("r2"))
    served.wait_for("partial", "p1")
    served.wait_for("final", "r2")
