"""`[kv] device_codec = "on"` on CPU nodes: the prefill engine exports each prompt's KV encoded layer
by layer (nodes/engines/kv_export.py) and the decode node decodes chunks on the device path
(kv_landing.py). Both are bit for bit the CPU codec's, so a cluster's greedy int8 and bf16 streams
equal a cluster's with the CPU codec (broker, prefill and decode nodes as real processes). The same
test on a GPU is tests/integration/test_cluster_cuda.py, where "auto" turns the codec on."""

from __future__ import annotations

import asyncio

import pytest

from harness.cluster_procs import ClusterProcs
from tests.integration.cluster_helpers import PROMPTS, client_for, greedy, load

pytestmark = [pytest.mark.integration]


def streams(kv_quant: str, device_codec: str, prompts: list[tuple[int, ...]]) -> list[tuple[list[int], int]]:
    async def run_all(client):
        return await asyncio.gather(*(client.generate(p, greedy(12)).collect() for p in prompts))

    with ClusterProcs(num_prefill=1, num_decode=1, model="tiny", kv_quant=kv_quant,
                      settings={"kv": {"device_codec": device_codec}}) as procs, client_for(procs) as client:
        results = asyncio.run(run_all(client))
    for result in results:
        assert result.trace.plans == ["remote"] and result.trace.kv_wire_bytes > 0
    return [(list(r.token_ids), r.trace.kv_wire_bytes) for r in results]


@pytest.mark.parametrize("kv_quant", ["int8", "bf16"])
def test_streams_with_the_device_codec_equal_the_cpu_codecs(kv_quant):
    tiny = load("tiny")
    prompts = [tuple(tiny.tokenizer.encode(text)) for text in PROMPTS]
    assert streams(kv_quant, "on", prompts) == streams(kv_quant, "off", prompts)
