"""OpenAI `logprobs` objects from the cluster's per-token log-probabilities (pure).

Contract: `LogprobsFormat(tokenizer, chat)` turns a run of tokens into the `logprobs` field of a
choice (or of one stream chunk):
- completions `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`: a token's string is
  its id decoded alone (special tokens included, as vLLM shows them); `top_logprobs` maps the
  strings of the k likeliest tokens, and of the sampled one, to their log-probabilities (vLLM's
  shape; strings that decode alike collapse into one key); `text_offset` counts characters of
  those strings from the start of the choice's text, continued across chunks by the caller
  passing `offset`. Echoed prompt tokens come first; the first prompt token has no logprob (None).
- chat `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.
`Scored(token_id, logprobs)` is one token and its `TokenLogprobs` (None: not reported).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nodes.engines.engine_types import TokenLogprobs


@dataclass(frozen=True, slots=True)
class Scored:
    token_id: int
    logprobs: TokenLogprobs | None


class LogprobsFormat:
    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tokenizer, self.chat = tokenizer, chat

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def field(self, tokens: Sequence[Scored], offset: int = 0) -> dict[str, Any]:
        return self._chat(tokens) if self.chat else self._completion(tokens, offset)

    def _completion(self, tokens: Sequence[Scored], offset: int) -> dict[str, Any]:
        texts, logprobs, tops, offsets = [], [], [], []
        for token in tokens:
            text = self.token_text(token.token_id)
            texts.append(text)
            offsets.append(offset)
            offset += len(text)
            lp = token.logprobs
            logprobs.append(None if lp is None else lp.logprob)
            tops.append(None if lp is None else self._top(token.token_id, lp))
        return {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}

    def _top(self, token_id: int, lp: TokenLogprobs) -> dict[str, float]:
        top = {self.token_text(t): value for t, value in reversed(lp.top)}   # the likeliest wins a shared key
        top.setdefault(self.token_text(token_id), lp.logprob)
        return top

    def _chat(self, tokens: Sequence[Scored]) -> dict[str, Any]:
        content = []
        for token in tokens:
            lp = token.logprobs or TokenLogprobs(0.0)
            entry = self._entry(token.token_id, lp.logprob)
            entry["top_logprobs"] = [self._entry(t, value) for t, value in lp.top]
            content.append(entry)
        return {"content": content}

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def text_length(field: dict[str, Any]) -> int:
    """Characters a completions `logprobs` field's tokens span (the next chunk's offset start)."""
    return sum(len(t) for t in field.get("tokens", ()))
