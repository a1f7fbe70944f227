"""`pdbus cluster --brokers 2` with real tiny-model nodes: every node registers with both brokers,
a stream keeps going when one broker is SIGKILLed mid-stream (its requests adopted by the other),
and the supervisor starts the dead broker again on its address, where every node registers anew."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from nodes.cluster import ClusterClient
from nodes.engines.base import SamplingParams
from tests.bus.processes import LoggedProcess, pdbus

pytestmark = [pytest.mark.integration, pytest.mark.slow]


MAX_TOKENS = 1500   # long enough to outlive the broker's detection (the tiny model is fast)


async def _streams_across_a_broker_kill(endpoint: str, kill) -> tuple[list, list[int]]:
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    async with ClusterClient(endpoint, max_retries=0) as client:   # no retry: nothing may fail over
        generations = [client.generate([1, 2, 3, 4, 5, 6, 7], sampling, session_id=f"s-{i}") for i in range(4)]
        tasks = [asyncio.ensure_future(g.collect()) for g in generations]
        while min(len(g.tokens) for g in generations) < 10:
            await asyncio.sleep(0.02)
        kill()
        at_kill = [len(g.tokens) for g in generations]
        return await asyncio.gather(*tasks), at_kill


def test_a_broker_killed_mid_stream_is_replaced_and_no_stream_notices():
    cluster = LoggedProcess(pdbus("cluster", "--model", "tiny", "--prefill", "1", "--decode", "1", "--no-gateway",
                                  "--brokers", "2", "--endpoint", "tcp://127.0.0.1:0"),
                            env={"PDBUS__ENGINE__NUM_THREADS": "1"})
    try:
        endpoint = cluster.wait_for("cluster_ready", timeout=120)["endpoint"]
        assert len(endpoint.split(",")) == 2
        second = [e for e in cluster.find("cluster_child_started") if e.get("child") == "broker-1"][0]["pid"]
        results, at_kill = asyncio.run(_streams_across_a_broker_kill(endpoint, lambda: os.kill(second, signal.SIGKILL)))
        assert max(at_kill) < MAX_TOKENS   # the kill met live streams
        assert [len(r.token_ids) for r in results] == [MAX_TOKENS] * 4
        assert all(r.trace.failures == [] for r in results)
        assert cluster.find("requests_adopted")   # the survivor took the dead broker's streams
        cluster.wait_for("cluster_broker_died", timeout=10, child="broker-1")
        cluster.wait_for("broker_started", timeout=30, count=3)   # broker-1 again, on its port
    finally:
        cluster.stop()
