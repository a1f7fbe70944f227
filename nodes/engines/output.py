"""Per-request output: incremental text and the decision to stop. Plain Python, no torch.

Contract: `OutputTracker.push(token_id) -> (text, finish_reason)` for each sampled token in order.
- stop token ids and EOS (unless `ignore_eos` without a grammar) end the request with "stop"; their
  text is not emitted.
- a stop string ends it with "stop"; the text is cut just before the stop string (OpenAI semantics).
  Because a stop string can span tokens, up to `len(longest stop) - 1` characters are held back
  until they can no longer start one, so no emitted text ever has to be taken back.
- reaching `max_tokens` (or the `max_tokens` override: the room left in the context) ends it with "length" (the held-back text is released).
Replaying the same tokens into a new tracker yields the same texts, which is how a decode node
continues a stream whose first token a prefill node already emitted.
"""

from __future__ import annotations

from nodes.engines.base import FinishReason, SamplingParams


class OutputTracker:
    def __init__(self, tokenizer, sampling: SamplingParams, eos_token_ids: tuple[int, ...], *,
                 max_tokens: int | None = None) -> None:
        self._detokenizer = tokenizer.new_detokenizer()
        self._sampling = sampling
        # A grammar ends with EOS whatever `ignore_eos` says: once complete it allows nothing else.
        self._end_ids = frozenset(sampling.stop_token_ids) | (
            frozenset() if sampling.ignore_eos and sampling.grammar is None else frozenset(eos_token_ids))
        self._max_tokens = sampling.max_tokens if max_tokens is None else min(max_tokens, sampling.max_tokens)
        self._holdback = max((len(s) for s in sampling.stop), default=1) - 1
        self._text = ""          # all text decoded so far (after any stop-string cut)
        self._num_emitted = 0    # characters of `_text` already handed out
        self.num_tokens = 0
        self.finish_reason: FinishReason | None = None

    @property
    def text(self) -> str:
        return self._text

    def push(self, token_id: int) -> tuple[str, FinishReason | None]:
        if self.finish_reason is not None:
            raise RuntimeError("push after the request finished")
        self.num_tokens += 1
        if token_id in self._end_ids:
            self._text += self._detokenizer.flush()
            return self._finish("stop")
        search_from = max(0, len(self._text) - self._holdback)
        self._text += self._detokenizer.push(token_id)
        if self._cut_at_stop_string(search_from):
            return self._finish("stop")
        if self.num_tokens >= self._max_tokens:
            self._text += self._detokenizer.flush()
            return self._finish("length")
        return self._release(len(self._text) - self._holdback), None

    def abort(self) -> str:
        """End the stream; returns nothing more (held-back text of an aborted stream is dropped)."""
        self.finish_reason = "abort"
        return ""

    def _cut_at_stop_string(self, search_from: int) -> bool:
        hits = [i for i in (self._text.find(s, search_from) for s in self._sampling.stop) if i >= 0]
        if not hits:
            return False
        self._text = self._text[:min(hits)]
        return True

    def _finish(self, reason: FinishReason) -> tuple[str, FinishReason]:
        self.finish_reason = reason
        return self._release(len(self._text)), reason

    def _release(self, upto: int) -> str:
        if upto <= self._num_emitted:
            return ""
        text = self._text[self._num_emitted:upto]
        self._num_emitted = upto
        return text
