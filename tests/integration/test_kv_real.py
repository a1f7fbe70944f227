"""The KV codec on real KV from SmolLM2-135M (through transformers; cached under .models/)."""

from __future__ import annotations

import numpy as np
import pytest

from bus.kv import KVReceiver, KVSender
from harness.bench.kv_model import real_kv_fp32

pytestmark = [pytest.mark.integration, pytest.mark.real_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def real_kv() -> np.ndarray:
    return real_kv_fp32(1024)


async def test_real_kv_round_trips_in_every_mode(real_kv):
    assert real_kv.shape == (30, 2, 3, 1024, 64)
    receiver = KVReceiver()
    endpoint = await receiver.start()
    sender = KVSender()
    for mode in ("raw", "bf16", "int8"):
        report = await sender.send(endpoint, f"t-{mode}", "r", real_kv, mode=mode, compression="auto")
        result = await receiver.result(f"t-{mode}", timeout=30)
        # raw: two layers (3 MiB) per 4 MiB chunk; quantized: the values of 4 MiB of bf16 (8 MiB of
        # float32) per chunk, rounded down to whole layers: five (7.5 MiB)
        assert result.ok and report.stats.num_chunks == (15 if mode == "raw" else 6)
        error = np.abs(result.kv - real_kv)
        if mode == "raw":
            assert result.kv.tobytes() == real_kv.tobytes() and report.stats.ratio == 1.0
        elif mode == "bf16":
            assert (error <= np.abs(real_kv) * 2.0**-8).all()
        else:
            row_range = real_kv.max(-1, keepdims=True) - real_kv.min(-1, keepdims=True)
            assert (error <= row_range / 500 + 1e-3).all()
            assert 3.7 < report.stats.ratio < 3.8                 # 1 byte + 4/64 per value
    await sender.close()
    await receiver.close()
