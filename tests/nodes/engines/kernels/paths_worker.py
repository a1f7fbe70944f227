"""Run by test_cpu_paths.py in a fresh process (masks are read at the first probe): a prompt's
prefill and four greedy decode steps of the tiny model (head_dim 64, so every kernel can take it)
in the dtype given, printed as JSON with the plan the runner took and the modules loaded."""

from __future__ import annotations

import json
import sys

import torch

from nodes.engines.forward_batch import DecodeGroup, ForwardBatch, PrefillSpan
from nodes.engines.kernels.cpu import probe
from nodes.engines.llama import LlamaRunner
from nodes.engines.model_loader import build_tiny_model

PROMPT, STEPS = 40, 4


def main(dtype_name: str) -> None:
    model = build_tiny_model(seed=3, hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256)
    runner = LlamaRunner(model.config, model.weights, dtype=getattr(torch, dtype_name), max_len=64)
    kv = runner.new_kv(PROMPT + STEPS)
    ids = torch.arange(7, 7 + PROMPT) % model.config.vocab_size
    rows = torch.arange(PROMPT)
    logits = [runner.forward(ForwardBatch(ids, rows, rows[-1:], spans=[PrefillSpan(0, PROMPT, 0, kv)]))[0]]
    cache = kv[:, None].contiguous()   # one slot: [layers, 1, 2, kv_heads, capacity, head_dim]
    for step in range(STEPS):
        position = PROMPT + step
        group = DecodeGroup(rows=torch.tensor([0]), slots=torch.tensor([0]), positions=torch.tensor([position]),
                            cache=cache, num_slots=1, lengths=None, max_len=position + 1, dense=True)
        token = logits[-1].argmax().view(1)
        logits.append(runner.forward(ForwardBatch(token, torch.tensor([position]), torch.tensor([0]),
                                                  decode=group))[0])
    print(json.dumps({
        "features": probe().as_log(), "plan": runner.kernels.as_log(),
        "tokens": [int(row.argmax()) for row in logits], "logits": [row.float().tolist() for row in logits],
        "loaded": sorted(name for name in ("numba", "llvmlite") if name in sys.modules)}))


if __name__ == "__main__":
    main(sys.argv[1])
