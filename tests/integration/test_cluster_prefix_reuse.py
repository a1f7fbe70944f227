"""Decode-side prefix reuse end to end (real processes on loopback, tiny model, fp32, raw KV):
a second request with a shared opening takes it from the prefill node's prefix cache, and its plan
holds it on the decode node (kept with the first request's session), so only the rest of its KV
crosses the wire. The tokens equal one engine's. Another tenant's request with the same opening
hits nothing."""

from __future__ import annotations

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import client_for, greedy, load, reference

pytestmark = pytest.mark.integration


def test_a_shared_opening_is_held_on_the_decode_node_and_only_the_rest_is_sent():
    tiny = load("tiny")
    opening = tuple(range(10, 10 + 96))                    # 6 blocks of 16; 96 tokens shared
    prompts = [opening + (200 + i, 300 + i, 400 + i) for i in range(4)]
    # local_suffix_tokens 0: every plan is remote, so the test sees what crosses the wire.
    with ClusterProcs(num_prefill=1, num_decode=1, model="tiny", kv_quant="raw",
                      settings={"scheduler": {"local_suffix_tokens": 0}}) as cluster, client_for(cluster) as client:
        results = [client.generate_blocking(p, greedy(8), cache_salt="tenant-a") for p in prompts[:3]]
        other = client.generate_blocking(prompts[3], greedy(8), cache_salt="tenant-b")
    first, _, third = results
    # Every request is a session of its own: the first one's, kept, holds the opening for the next.
    assert [r.trace.num_cached_tokens for r in results] == [0, 96, 96]    # the prefill node's cache
    assert [r.trace.num_kv_held_tokens for r in results] == [0, 96, 96]   # the decode node's
    assert third.usage["cached_tokens"] == 96
    assert third.trace.plans == ["remote"]
    # Only 3 of 99 tokens' KV crossed the wire; the FINAL's counters say so.
    assert third.trace.kv_wire_bytes * 99 == pytest.approx(first.trace.kv_wire_bytes * 3, rel=0.01)
    assert third.trace.decode_final["stats"]["num_cached_tokens"] == 96
    assert other.trace.num_kv_held_tokens == other.trace.num_cached_tokens == 0
    assert other.trace.kv_wire_bytes == first.trace.kv_wire_bytes
    for prompt, result in zip(prompts, [*results, other], strict=True):
        assert result.token_ids == reference(tiny, prompt, greedy(8))
