"""Plain vLLM, no pdbus in the loop: greedy token ids for prompts, one request at a time.

Run as a process (`python -m tests.integration.vllm_reference FOLDER MAX_TOKENS DTYPE < prompts.json`);
prints `{"outputs": [[ids...], ...]}` as the last line. The disaggregated pdbus+vLLM tests compare
their streams with this. vLLM runs in-process with the settings pdbus uses (eager, no prefix caching).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    folder, max_tokens, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    prompts = json.loads(sys.stdin.read())
    for name, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                        "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}.items():
        os.environ.setdefault(name, value)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=folder, dtype=dtype, enforce_eager=True, enable_prefix_caching=False, max_model_len=4096,
              seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = [list(llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0].outputs[0].token_ids)
               for p in prompts]
    print(json.dumps({"outputs": outputs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
