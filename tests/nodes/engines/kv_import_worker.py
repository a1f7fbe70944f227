"""Decode side of the cross-process equivalence test, run as `python -m tests.nodes.engines.kv_import_worker FILE`.

FILE holds one JSON line per request {"request_id", "prompt", "first_token_id", "shape", "max_tokens"}
followed by the raw little-endian float32 bytes of its KV ([layers, 2, kv_heads, tokens, head_dim]).
The worker loads the real model, imports each KV (lossless: the bytes are the tensor) into a fresh
engine, decodes greedily and prints {"request_id": [tokens...]} as one JSON line.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
from nodes.engines.llama_engine import LlamaEngine
from nodes.engines.model_loader import load_model


def read_requests(path: str) -> list[tuple[dict, torch.Tensor]]:
    items = []
    with open(path, "rb") as f:
        while header := f.readline():
            meta = json.loads(header)
            count = int(np.prod(meta["shape"]))
            data = np.frombuffer(f.read(count * 4), dtype="<f4").reshape(meta["shape"])
            items.append((meta, torch.from_numpy(data.copy())))
    return items


def write_request(f, meta: dict, kv: torch.Tensor) -> None:
    f.write((json.dumps(meta | {"shape": list(kv.shape)}) + "\n").encode())
    f.write(kv.contiguous().numpy().astype("<f4").tobytes())


def main(path: str) -> None:
    engine = LlamaEngine(load_model(), EngineConfig(dtype="float32"))
    out = {}
    for meta, kv in read_requests(path):
        sampling = SamplingParams(temperature=0.0, max_tokens=meta["max_tokens"], ignore_eos=True)
        request = DecodeRequest(meta["request_id"], tuple(meta["prompt"]), sampling, kv=kv,
                                first_token_id=meta["first_token_id"])
        assert engine.add_request(request).ok
    while engine.has_unfinished():
        for event in engine.step():
            out.setdefault(event.request_id, []).append(event.token_id)
    assert engine.stats.num_prefilled_tokens == 0
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
