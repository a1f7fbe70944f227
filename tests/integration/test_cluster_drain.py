"""Drains and role switches with real processes on loopback (tiny model, fp32, greedy, raw KV),
docs/CLUSTER.md "Drains and role switches": a decode node SIGTERMed mid-stream hands its stream
over at the drain deadline and the client resumes it exactly on the other node, spending no retry;
a drain with time to spare finishes the stream where it runs; a `control` peer switches a decode
node to prefill, the broker routes prefill work to it (the old prefill node killed), and back."""

from __future__ import annotations

import asyncio
import signal

import pytest

from bus.constants import BROKER_STATS_SERVICE
from bus.endpoint import Endpoint
from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference, wait_until
from tests.integration.test_cluster_failover import stream_and_act

pytestmark = pytest.mark.integration
SLOW_DECODE = ["--test-step-delay-ms", "40"]


@pytest.fixture(scope="module")
def tiny():
    return load("tiny")


def test_a_decode_node_drained_mid_stream_hands_it_over_and_it_resumes_exactly(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[1]))
    with ClusterProcs(num_prefill=1, num_decode=2, extra_args={"decode": SLOW_DECODE},
                      settings={"node": {"drain_timeout_s": 0.3}}) as cluster, client_for(cluster) as client:
        drained = []

        def drain_serving(generation):
            drained.append(generation.trace.decode_node_ids[-1])
            cluster.kill(drained[0], signal.SIGTERM)

        result = asyncio.run(stream_and_act(client, prompt, greedy(60), 8, drain_serving))
        assert result.token_ids == reference(tiny, prompt, greedy(60))
        assert result.trace.failures == [f"draining@{drained[0]}"] and result.trace.num_failovers == 1
        assert result.trace.decode_node_ids[-1] != drained[0]
        node = cluster.nodes[drained[0]]
        assert node.wait_exit(10) == 0 and node.find("drain_handed_over", num_requests=1)
        assert cluster.broker.find("node_left", node_id=drained[0], reason="disconnected")


def test_a_drain_with_time_to_spare_finishes_the_stream_where_it_runs(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[0]))
    with ClusterProcs(num_prefill=1, num_decode=2, extra_args={"decode": SLOW_DECODE}) as cluster, \
            client_for(cluster) as client:
        drained = []

        def drain_serving(generation):
            drained.append(generation.trace.decode_node_ids[-1])
            cluster.kill(drained[0], signal.SIGTERM)

        result = asyncio.run(stream_and_act(client, prompt, greedy(30), 5, drain_serving))
        assert result.token_ids == reference(tiny, prompt, greedy(30)) and result.trace.failures == []
        assert cluster.nodes[drained[0]].wait_exit(10) == 0
        # New work goes to the node that stays; the drained one never took any after the signal.
        after = client.generate_blocking(prompt, greedy(4))
        assert after.trace.decode_node_ids == [n for n in cluster.nodes if n.startswith("decode") and n != drained[0]]


def broker_stats(endpoint: Endpoint) -> dict:
    (final,) = endpoint.request(BROKER_STATS_SERVICE, {}, timeout=5).collect()
    return final.body


def test_a_control_peer_switches_a_decode_node_to_prefill_and_back(tiny):
    prompt = tuple(tiny.tokenizer.encode(PROMPTS[2]))
    with ClusterProcs(num_prefill=1, num_decode=2, extra_args={"decode": ["--switchable"]}) as cluster, \
            client_for(cluster) as client, Endpoint(cluster.broker_endpoint, "control", "planner") as planner:
        assert planner.wait_registered(10)
        planner.send_control("decode-1", {"action": "role", "role": "prefill"})
        wait_until(lambda: broker_stats(planner)["role_by_node"].get("decode-1") == "prefill", message="switch")
        assert cluster.nodes["decode-1"].find("role_switched", role="prefill")
        cluster.kill("prefill-0")   # only the switched node prefills now
        result = client.generate_blocking(prompt, greedy(12))
        assert result.token_ids == reference(tiny, prompt, greedy(12))
        assert result.trace.prefill_node_ids[-1] == "decode-1" and result.trace.decode_node_ids == ["decode-0"]
        planner.send_control("decode-1", {"action": "role", "role": "decode"})
        wait_until(lambda: broker_stats(planner)["role_by_node"].get("decode-1") == "decode", message="back")
        capacity = broker_stats(planner)["capacity_by_node"]["decode-1"]
        assert capacity["role_switches"] == 2 and "kv_blocks_total" in capacity
