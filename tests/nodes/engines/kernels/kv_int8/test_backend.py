"""Which int8 KV codec serves is kernels.dispatch's: the kernels where they compile, compiled torch
where their warm-up fails (a compiler that cannot build them), so a node still starts and sends."""

from __future__ import annotations

from nodes.engines.kernels.kv_int8 import encode
from nodes.engines.kv_quant import TorchQuantizer


def test_a_failing_warm_up_leaves_int8_to_torch(monkeypatch, fresh_dispatch):
    def broken() -> None:
        raise RuntimeError("LLVM cannot build the int8 kernels")
    monkeypatch.setattr(encode, "warmup", broken)
    assert fresh_dispatch.kv_int8_backend() == "torch"
    assert not TorchQuantizer(compile=True).fast_int8
