"""`pdbus cluster` with real prefill and decode nodes (the tiny model) and the scheduler: a decode
node that runs its one allowed stream makes the next session wait in the broker's queue until the
stream ends, and a third session finds the queue full and is told `overloaded` with a retry hint.
Slow: two engine processes start on a 2-core machine (about 20-30 s)."""

from __future__ import annotations

import asyncio

import pytest

from nodes.cluster import ClusterClient, ClusterError
from nodes.engines.base import SamplingParams
from tests.bus.processes import LoggedProcess, pdbus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RETRY_AFTER_S = 0.25


async def _three_sessions(endpoint: str) -> list:
    sampling = SamplingParams(temperature=0.0, max_tokens=160, ignore_eos=True)
    async with ClusterClient(endpoint, max_retries=0) as client:
        generations = [client.generate([1, 2, 3, 4, 5, 6], sampling, session_id=f"session-{i}")
                       for i in range(3)]
        return await asyncio.gather(*(g.collect() for g in generations), return_exceptions=True)


def test_a_full_decode_node_queues_the_next_session_and_overloads_the_one_after():
    cluster = LoggedProcess(pdbus("cluster", "--model", "tiny", "--prefill", "1", "--decode", "1", "--no-gateway",
                                  "--endpoint", "tcp://127.0.0.1:0"), env={
        "PDBUS__DECODE__MAX_NUM_SEQS": "1", "PDBUS__SCHEDULER__QUEUE_SIZE": "1",
        "PDBUS__SCHEDULER__QUEUE_TIMEOUT_S": "60", "PDBUS__SCHEDULER__RETRY_AFTER_S": str(RETRY_AFTER_S),
        "PDBUS__ENGINE__NUM_THREADS": "1"})
    try:
        endpoint = cluster.wait_for("cluster_ready", timeout=120)["endpoint"]
        results = asyncio.run(_three_sessions(endpoint))
    finally:
        cluster.stop()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], ClusterError), results
    assert errors[0].code == "overloaded" and errors[0].details.get("retry_after_s") == RETRY_AFTER_S
    served = [r for r in results if not isinstance(r, BaseException)]
    assert [len(r.token_ids) for r in served] == [160, 160]
    metrics = cluster.wait_for("broker_stopped")["metrics"]
    assert (metrics["queue.deferred"], metrics["queue.dispatched"], metrics["rejected.overloaded"]) == (1, 1, 1)
