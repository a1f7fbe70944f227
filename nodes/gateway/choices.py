"""One choice of a response built from its cluster stream (pure: no I/O): text, logprobs, echo.

Contract: `ChoiceBuilder(index, api_request, generation, tokenizer)`:
- `opening()` -> text: what comes before the completion, which is the echoed prompt (completions
  `echo`: its text; with `logprobs`, the choice's field starts with its tokens' logprobs, the first
  None) or nothing;
- `stream_opening(ended)` -> (text, logprobs field | None) | None: the opening as a stream's first
  content, once. Echo without logprobs: at once. With logprobs: once the prompt logprobs are in
  (a FINAL brings them: the prefill node's, about with the first token, or the decode node's at
  the end of a stream it prefilled itself) or the stream `ended`; until then `awaits_opening`,
  and the caller holds the choice's tokens back, so offsets and order match the JSON response;
- `add(token)` -> (text, logprobs field | None) for one StreamToken (the field only when the request
  asked for logprobs), accumulated for the whole choice;
- `choice(finish_reason)` -> `Choice`: the opening and every token added. A chat request that
  offers tools holds its text back (`holds_text`: `add` returns none of it) and parses it at the end
  into content and `tool_calls` (finish_reason `tool_calls` when there are calls).
`echo` with `max_tokens` 0 scores the prompt only: the one token the cluster generates is dropped
(the choice ends with "length", no completion tokens), as OpenAI's legacy completions did.
"""

from __future__ import annotations

from typing import Any

from nodes.gateway.logprobs_format import LogprobsFormat, Scored, text_length
from nodes.gateway.openai_format import Choice
from nodes.gateway.tool_calls import parse_tool_calls


class ChoiceBuilder:
    def __init__(self, index: int, api_request: Any, generation: Any, tokenizer: Any) -> None:
        self.index, self.api, self.generation, self.tokenizer = index, api_request, generation, tokenizer
        self.format = LogprobsFormat(tokenizer, api_request.chat) if api_request.logprobs is not None else None
        self.scored_only = api_request.echo and api_request.max_tokens == 0
        tools = api_request.tools
        self.tools = tools if api_request.chat and tools is not None and tools.offered else None
        self.texts: list[str] = []
        self.scored: list[Scored] = []
        self.opening_text, self.opening_scored = "", list[Scored]()
        self.offset = 0   # completions: characters of token strings so far (text_offset)
        self.opened = False   # stream_opening has given the opening

    def opening(self) -> str:
        """The choice's start: a JSON response calls it after its stream (when the prompt logprobs,
        which come with a FINAL, are in), a stream through `stream_opening`."""
        if not self.api.echo:
            return ""
        self.opening_text = self.api.prompt if self.api.prompt is not None else \
            self.tokenizer.decode(self.generation.prompt)
        if self.format is not None:
            found = self.generation.prompt_logprobs
            self.opening_scored = [Scored(t, found[i] if i < len(found) else None)
                                   for i, t in enumerate(self.generation.prompt)]
        return self.opening_text

    @property
    def awaits_opening(self) -> bool:
        """A streamed echo whose opening is not sent yet: the choice's tokens must wait for it."""
        return self.api.echo and not self.opened

    def stream_opening(self, ended: bool = False) -> tuple[str, dict[str, Any] | None] | None:
        if not self.awaits_opening:
            return None
        if self.format is not None and not self.generation.prompt_logprobs and not ended:
            return None
        self.opened = True
        text = self.opening()
        return text, self._field(self.opening_scored) if self.format is not None else None

    def add(self, token: Any) -> tuple[str, dict[str, Any] | None]:
        if self.scored_only:
            return "", None
        self.texts.append(token.text)
        shown = "" if self.holds_text else token.text
        if self.format is None:
            return shown, None
        scored = [Scored(token.token_id, token.logprobs)]
        self.scored.extend(scored)
        return shown, self._field(scored)

    @property
    def holds_text(self) -> bool:
        return self.tools is not None

    def _field(self, scored: list[Scored]) -> dict[str, Any]:
        assert self.format is not None
        field = self.format.field(scored, self.offset)
        self.offset += text_length(field)
        return field

    def choice(self, finish_reason: str | None) -> Choice:
        logprobs = None
        if self.format is not None:
            logprobs = self.format.field(self.opening_scored + self.scored)
        text: str | None = self.opening_text + "".join(self.texts)
        calls: list[dict[str, Any]] = []
        if self.tools is not None:
            text, calls = parse_tool_calls(text or "", self.tools.offered, forced=self.tools.forced)
        reason = "length" if self.scored_only else ("tool_calls" if calls else finish_reason)
        return Choice(self.index, text, reason, logprobs, calls or None)
