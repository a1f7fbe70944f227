"""pdbus's requests in vLLM's terms, and vLLM's outputs in pdbus's: what `VllmEngine`
(nodes/engines/vllm_engine.py) hands vLLM and reads back.

Contract:
- `vllm_sampling(sampling, *, max_tokens, kv_key, capture=False)`: vLLM's SamplingParams for a
  request whose text, stops and EOS pdbus's `OutputTracker` decides (vLLM only samples, delta
  outputs, token ids only); `kv_key` (and `capture`, on a prefill) go to `PdbusConnector` in
  `kv_transfer_params` (nodes/engines/vllm_mailbox.py). A grammar raises ValueError(NO_GRAMMARS).
- `vllm_prompt(token_ids, salt)`: vLLM's TokensPrompt, its prefix cache scoped by `salt`.
- `passed_logprobs(positions, index, token_id, k)`: vLLM's logprobs at one position as pdbus's
  `TokenLogprobs`, or None.
Only `vllm_sampling` imports vLLM (when called), so the rest is usable and testable without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nodes.engines.engine_types import SamplingParams, TokenLogprobs
from nodes.engines.vllm_mailbox import CAPTURE_PARAM, KV_KEY_PARAM

NO_GRAMMARS = "structured output (a grammar) is served by the built-in engine, not by vLLM engines yet"


def vllm_sampling(sampling: SamplingParams, *, max_tokens: int, kv_key: str, capture: bool = False) -> Any:
    from vllm import SamplingParams as VllmSampling
    from vllm.sampling_params import RequestOutputKind

    if sampling.grammar is not None:
        raise ValueError(NO_GRAMMARS)
    transfer = {KV_KEY_PARAM: kv_key} | ({CAPTURE_PARAM: True} if capture else {})
    # pdbus's OutputTracker decides EOS, stop ids and stop strings; vLLM only samples.
    # Logprobs are vLLM's own (its default raw_logprobs mode: the model's distribution, as ours);
    # prompt logprobs only where the prompt is computed (a prefill), never over imported KV.
    return VllmSampling(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                        seed=sampling.seed, max_tokens=max(1, max_tokens), ignore_eos=True, detokenize=False,
                        presence_penalty=sampling.presence_penalty, frequency_penalty=sampling.frequency_penalty,
                        repetition_penalty=sampling.repetition_penalty,
                        logit_bias=dict(sampling.logit_bias) or None, logprobs=sampling.logprobs,
                        prompt_logprobs=sampling.prompt_logprobs if capture else None,
                        output_kind=RequestOutputKind.DELTA, extra_args={"kv_transfer_params": transfer})


def passed_logprobs(positions: Any, index: int, token_id: int, k: int | None) -> TokenLogprobs | None:
    """vLLM's logprobs at one position ({token id: Logprob(logprob, rank)}: the top k by rank and
    the chosen token, whatever its rank) as ours; None where vLLM has none (not asked, or the
    first prompt token)."""
    if k is None or not positions or index >= len(positions) or positions[index] is None:
        return None
    entry = positions[index]
    ranked = sorted((lp.rank if lp.rank is not None else 1 << 62, t, float(lp.logprob)) for t, lp in entry.items())
    chosen = entry.get(token_id)
    return TokenLogprobs(float(chosen.logprob) if chosen is not None else float("-inf"),
                         tuple((t, value) for _, t, value in ranked[:k]))


def vllm_prompt(token_ids: Sequence[int], salt: str) -> Any:
    """vLLM's TokensPrompt (a dict; typed Any, as vLLM's own unions change between versions); a
    salt scopes its prefix cache to the tenant (none: shared)."""
    prompt: dict[str, Any] = {"prompt_token_ids": list(token_ids)}
    return prompt | {"cache_salt": salt} if salt else prompt
