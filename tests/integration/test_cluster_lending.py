"""Lending with real processes (tiny model, fp32, greedy, raw KV): while a slow prefill node holds
one prompt, the next request's decode node prefills its prompt itself (plan `local`, no KV
transfer) and every request still gets exactly the fault-free tokens."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load, reference

pytestmark = pytest.mark.integration
LEND = {"lend_prefill_tokens": 4096, "lend_max_running": 4, "lend_min_backlog_tokens": 1}


def test_a_light_decode_node_prefills_what_would_queue_at_a_busy_prefill_node():
    tiny = load("tiny")
    prompts = [tuple(tiny.tokenizer.encode(p)) for p in PROMPTS[:3]]
    with ClusterProcs(num_prefill=1, num_decode=1, settings={"decode": LEND},
                      extra_args={"prefill": ["--test-prefill-delay-ms", "400"]}) as cluster, \
            client_for(cluster) as client:

        async def run_all():
            first = asyncio.create_task(client.generate(prompts[0], greedy(8)).collect())
            await asyncio.sleep(0.15)   # its prompt now waits at the slow prefill node
            rest = [asyncio.create_task(client.generate(p, greedy(8)).collect()) for p in prompts[1:]]
            return await asyncio.gather(first, *rest)

        results = asyncio.run(run_all())
        assert [r.token_ids for r in results] == [reference(tiny, p, greedy(8)) for p in prompts]
        assert results[0].trace.plans == ["remote"]
        assert "local" in [r.trace.plans[0] for r in results[1:]]   # lent: the decode node prefilled it
