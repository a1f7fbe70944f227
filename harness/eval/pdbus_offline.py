"""lm-eval model `pdbus-offline`: the built-in engine in this process, asked what a cluster is asked.

Contract: importing this module registers `pdbus-offline` with lm-eval (`lm_eval.api.registry`).
model_args: `model` (a pdbus model spec: `SmolLM2-135M-Instruct`, `tiny`, a folder or .gguf),
`dtype` (`float32` default), `mode` (`completions` or `chat`), `max_length` (2048) and
`max_gen_toks` (256) as lm-eval's API models take them, `batch_size` (prompts per prefill pass:
1 by default, as a cluster serving one request at a time; more is faster, but a pass's rounding then
depends on its other prompts, docs/EVAL.md). Each request is computed as a disaggregated cluster computes it for lm-eval's
`local-completions` / `local-chat-completions`, with the same engine calls a prefill and a decode
node make, so a cluster with raw KV is expected to score exactly the same:

- loglikelihood (mode `completions`): context + continuation token ids (lm-eval tokenizes them with
  the model folder's Hugging Face tokenizer, as it does for local-completions), left-truncated to
  `max_length - 1` tokens, are prefilled with `prompt_logprobs=1`; the score is the sum of the
  continuation's logprobs in order, greedy when each equals its position's top logprob (what
  local-completions reads from `echo` + `logprobs=1`).
- generate_until, mode `completions`: the context's token ids (truncated as local-completions
  does), greedy, stop strings = `until` + the tokenizer's EOS text (what local-completions sends);
  mode `chat`: the messages rendered with the model's chat template and tokenized by pdbus's own
  tokenizer (what the gateway does), stop strings = the first four of `until` (what
  local-chat-completions sends). Either way the prompt is prefilled (`Engine.prefill`), its KV and
  first token handed to `Engine.add_request` and decoded to the end.
- loglikelihood_rolling is not offered (the tasks here do not use it).

The engine is built with no prefix cache and no kept sessions, one torch thread, so the reference is
the plain computation. `tokenizer_folder(spec)` gives the Hugging Face tokenizer folder lm-eval
loads for a spec (for `tiny`, a copy saved under the model cache), for the cluster runs too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

GREEDY_SEED = 1234   # what lm-eval's API models send; greedy decoding does not read it
CHAT_MAX_STOPS = 4   # local-chat-completions sends the first four stop strings only


def tokenizer_folder(spec: str) -> Path:
    """A folder holding `spec`'s tokenizer.json and tokenizer_config.json (Hugging Face loads it offline)."""
    from nodes.engines.model_loader import TINY_SPEC, build_tiny_model, default_model_dir, prepare_model

    if spec != TINY_SPEC:
        return prepare_model(spec)
    folder = default_model_dir() / "tiny-tokenizer"
    if not (folder / "tokenizer_config.json").is_file():
        model = build_tiny_model()
        folder.mkdir(parents=True, exist_ok=True)
        model.tokenizer.save(folder, model_max_length=model.config.max_position_embeddings)
    return folder


def hf_tokenizer(spec: str) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_folder(spec)))


def continuation_score(prompt_logprobs: list[Any], ctxlen: int) -> tuple[float, bool]:
    """(sum of the logprobs from position `ctxlen` on, whether each was its position's likeliest),
    summed in order as local-completions sums what `echo` returns."""
    total, greedy = 0.0, True
    for entry in prompt_logprobs[ctxlen:]:
        total += entry.logprob
        greedy = greedy and entry.logprob == max(lp for _, lp in entry.top)
    return total, greedy


@register_model("pdbus-offline")
class PdbusOffline(TemplateLM):
    def __init__(self, model: str = "SmolLM2-135M-Instruct", dtype: str = "float32", mode: str = "completions",
                 max_length: int = 2048, max_gen_toks: int = 256, batch_size: int | str = 1, **_: Any) -> None:
        super().__init__()
        if mode not in ("completions", "chat"):
            raise ValueError(f"mode must be 'completions' or 'chat', got {mode!r}")
        self.mode, self.spec = mode, model
        self.max_length = int(max_length) - 1   # as lm-eval's API models: one token is always generated
        self._max_gen_toks = int(max_gen_toks)
        self.batch_size = max(1, int(batch_size)) if str(batch_size).isdigit() else 1
        self.engine = _new_engine(model, dtype)
        self.pdbus_tokenizer = self.engine.tokenizer
        # Hugging Face's tokenizer (mode completions; None in chat mode, where lm-eval reads none of
        # the members below that use it): untyped, as `hf_tokenizer` returns it.
        self.tokenizer: Any = hf_tokenizer(model) if mode == "completions" else None
        self._num_requests = 0

    # ---- tokenization, as lm-eval's local-completions does it ----------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eot_token_id

    @property
    def tokenizer_name(self) -> str:
        return f"pdbus-{self.spec}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **_: Any) -> list[int]:
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens),
                              return_attention_mask=False).input_ids

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The messages themselves (as JSON): the gateway renders them, so generate_until does here."""
        return json.dumps(chat_history, ensure_ascii=False)

    # ---- requests ----------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **_: Any) -> list[tuple[float, bool]]:
        inputs = [self._scored_input(context_enc, continuation_enc) for _, context_enc, continuation_enc in requests]
        results: list[tuple[float, bool]] = []
        for start in tqdm(range(0, len(inputs), self.batch_size), disable=disable_tqdm, desc="pdbus-offline"):
            batch = inputs[start:start + self.batch_size]
            prefilled = self.engine.prefill([self._prefill_request(ids, _scoring()) for ids, _ in batch])
            results.extend(continuation_score(list(r.prompt_logprobs), ctxlen)
                           for r, (_, ctxlen) in zip(prefilled, batch, strict=True))
        return results

    def _scored_input(self, context_enc: list[int], continuation_enc: list[int]) -> tuple[list[int], int]:
        """(token ids, context length) exactly as local-completions builds its echo request."""
        tokens = (context_enc + continuation_enc)[-self.max_length:]
        ctxlen = len(context_enc) - max(0, len(context_enc) + len(continuation_enc) - self.max_length)
        return tokens, ctxlen

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        return [self._generate(*request.args[:2])
                for request in tqdm(requests, disable=disable_tqdm, desc="pdbus-offline")]

    def _generate(self, context: Any, gen_kwargs: dict) -> str:
        from nodes.engines.base import SamplingParams

        gen_kwargs = dict(gen_kwargs)
        max_tokens = int(gen_kwargs.pop("max_tokens", gen_kwargs.pop("max_gen_toks", self._max_gen_toks)))
        until = gen_kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        if self.mode == "chat":
            text = self.pdbus_tokenizer.apply_chat_template(json.loads(context))
            ids, stops = self.pdbus_tokenizer.encode(text), until[:CHAT_MAX_STOPS]
        else:
            eos = self.tokenizer.eos_token
            ids = self.tok_encode(context)[-(self.max_length - max_tokens):]
            stops = until + ([eos] if eos is not None and eos not in until else [])
        sampling = SamplingParams(temperature=float(gen_kwargs.pop("temperature", 0.0)), max_tokens=max_tokens,
                                  stop=tuple(stops), seed=GREEDY_SEED)
        return self._prefill_then_decode(ids, sampling)

    def _prefill_then_decode(self, ids: list[int], sampling: Any) -> str:
        """What a prefill node then a decode node do for one request, with raw KV between them."""
        from nodes.engines.base import DecodeRequest

        request = self._prefill_request(ids, sampling)
        first = self.engine.prefill([request])[0]
        if first.finish_reason is not None:
            return first.text
        admission = self.engine.add_request(DecodeRequest(request.request_id, request.prompt_token_ids, sampling,
                                                          kv=first.kv, first_token_id=first.first_token_id))
        if not admission.ok:
            raise RuntimeError(f"pdbus-offline: the engine refused a request: {admission.reason}")
        pieces = [first.text]
        while self.engine.has_unfinished():
            pieces.extend(event.text for event in self.engine.step())
        return "".join(pieces)

    def _prefill_request(self, ids: list[int], sampling: Any) -> Any:
        from nodes.engines.base import PrefillRequest

        self._num_requests += 1
        return PrefillRequest(f"eval-{self._num_requests}", tuple(ids), sampling)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        raise NotImplementedError("pdbus-offline scores continuations and generates; no rolling loglikelihood")


def _scoring() -> Any:
    """What local-completions asks for a loglikelihood request: echo, logprobs=1, one token, greedy."""
    from nodes.engines.base import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=1, seed=GREEDY_SEED)


def _new_engine(spec: str, dtype: str) -> Any:
    from nodes.engines.base import EngineConfig
    from nodes.engines.llama_engine import LlamaEngine
    from nodes.engines.model_loader import load_model

    config = EngineConfig(dtype=dtype, num_threads=1, prefix_cache_bytes=0, keep_sessions=False,
                          keep_prefixes=False, preallocate_kv=False)
    return LlamaEngine(load_model(spec), config)   # loaded as a node loads it; the runner casts to `dtype`
