"""One vLLM decode engine in its own process, given KV that cannot be injected (wrong head count).

Run as `python -m tests.integration.vllm_load_failure_worker FIRST_TOKEN MAX_TOKENS < prompt.json`;
prints `{"tokens": [...], "load_failures": n, "injected": n}` as the last line. The KV passes pdbus's
own checks (its token count fits the prompt) and fails only inside the connector, so this exercises
vLLM's kv_load_failure_policy="recompute" path.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    first_token, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    prompt = tuple(json.loads(sys.stdin.read()))
    import torch

    from nodes.engines.base import DecodeRequest, EngineConfig, SamplingParams
    from nodes.engines.model_loader import open_model_folder
    from nodes.engines.vllm_engine import VllmEngine
    from nodes.engines.vllm_mailbox import MAILBOX

    model = open_model_folder("SmolLM2-135M-Instruct")
    engine = VllmEngine(model, EngineConfig(dtype="bfloat16", num_threads=1), role="decode")
    c = model.config
    wrong = torch.zeros((c.num_layers, 2, c.num_kv_heads - 1, len(prompt), c.head_dim), dtype=torch.bfloat16)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    assert engine.add_request(DecodeRequest("r", prompt, sampling, kv=wrong, first_token_id=first_token)).ok
    tokens = [first_token]
    while engine.has_unfinished():
        tokens += [e.token_id for e in engine.step() if e.token_id is not None]
    print(json.dumps({"tokens": tokens, "load_failures": MAILBOX.stats.num_load_failures,
                      "injected": MAILBOX.stats.num_injected}))
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
