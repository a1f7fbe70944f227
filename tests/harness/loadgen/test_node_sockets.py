"""The load generator on real sockets: a broker process, one load-generator process of two
nodes, and a bus client here. Every token of every stream arrives once and in order, then the
FINAL; a node with max_batch streams running refuses with `full`; a cancelled stream stops on
its node; and the cluster's own client (what the gateway runs) reads the streams as it reads a
real decode node's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bus.bus_client import BusClient
from bus.mailbox import BusError
from bus.messages import Final
from harness.bench.bus_bench import start_server
from harness.bench.scale_procs import Child
from harness.loadgen.core import STAMP_FIELD
from nodes import wire

pytestmark = pytest.mark.integration


@pytest.fixture
def broker() -> Iterator[str]:
    process, endpoint = start_server("broker")
    yield endpoint
    process.terminate()
    process.wait(5)


def loadgen(endpoint: str, *extra: str) -> Child:
    child = Child("loadgen", ["-m", "harness.loadgen", "--broker", endpoint, "--nodes", "2", "--prefix", "lg",
                              "--step-s", "0.005", *extra])
    assert child.expect("ready", 30)["node_ids"] == ["lg-0", "lg-1"]
    return child


def stopped(child: Child) -> dict:
    child.terminate()
    stats = child.expect("stats", 30)
    child.stop()
    return stats


def request(max_tokens: int) -> dict:
    return wire.to_wire(wire.DecodeRequestBody((1, 2, 3), wire.SamplingParams(max_tokens=max_tokens)))


@pytest.mark.parametrize("path", [(), ("--per-token",)], ids=["batched", "per-token"])
def test_every_token_arrives_once_in_order_then_the_final(broker, path):
    node = loadgen(broker, "--max-batch", "8", *path)
    try:
        with BusClient(broker) as client:
            streams = [client.stream("decode", request(5 + i), timeout=10) for i in range(6)]
            replies = [stream.collect() for stream in streams]
    finally:
        stats = stopped(node)
    plans = set()
    for i, stream in enumerate(replies):
        plan, *tokens, final = stream
        plans.add(wire.from_wire(wire.PlanBody, plan.body).node_id)
        assert [t.seq for t in stream] == list(range(len(stream)))
        read = [wire.read_partial(t.body, wire.Bounds()) for t in tokens]
        assert [t.index for t in read] == list(range(5 + i)) and all(STAMP_FIELD in t.body for t in tokens)
        assert isinstance(final, Final)
        assert wire.from_wire(wire.DecodeDoneBody, final.body).usage.completion_tokens == 5 + i
    assert plans == {"lg-0", "lg-1"}   # the broker spread the streams over both nodes
    assert stats["counters"]["tokens"] == sum(5 + i for i in range(6)) and stats["counters"]["finished"] == 6
    sent = stats["endpoint"].get("sent.streams", 0)
    assert (sent > 0) == (path == ())   # the batched path sent STREAMS messages, the old one none


def test_full_at_max_batch_and_cancel_stops_the_stream(broker):
    node = loadgen(broker, "--max-batch", "1")
    try:
        with BusClient(broker) as client:
            long = [client.stream("decode", request(10_000), timeout=10) for _ in range(2)]
            for stream in long:
                next(stream), next(stream)   # the plan and a token: both nodes are full now
            with pytest.raises(BusError) as refused:
                client.stream("decode", request(5), timeout=10).collect()
            assert refused.value.code == wire.Code.FULL
            for stream in long:
                stream.cancel()
            time.sleep(0.3)
            assert len(client.stream("decode", request(3), timeout=10).collect()) == 5   # room again
    finally:
        stats = stopped(node)
    assert stats["counters"]["cancelled"] == 2 and stats["counters"]["refused.full"] >= 1


@pytest.mark.parametrize("stamp", ["none", "field", "text"])
def test_the_cluster_client_reads_a_load_generator_like_a_decode_node(broker, stamp):
    from nodes.cluster import ClusterClient

    node = loadgen(broker, "--stamp", stamp)
    try:
        client = ClusterClient(broker, stall_timeout_s=10, plan_timeout_s=10).start()
        try:
            result = client.generate_blocking([1, 2, 3], wire.SamplingParams(max_tokens=7))
        finally:
            client.close()
    finally:
        stopped(node)
    assert len(result.token_ids) == 7 and result.finish_reason == "length"
    assert result.trace.plans == [wire.PlanKind.LOCAL] and not result.trace.failures
