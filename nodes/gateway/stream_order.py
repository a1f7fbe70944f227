"""The order of a completion stream's content chunks (pure: no I/O): what each choice sends when.

Contract: `StreamOrder(builders)` over a response's ChoiceBuilders; `start(index)` once per choice
as the stream begins, `token(index, token)` for each StreamToken as it arrives, `ended()` after
the last: each returns the content to send now, in order, as (choice index, text, logprobs field
or None). A choice's streamed echo (ChoiceBuilder.stream_opening) goes before any of its tokens:
tokens that arrive while it waits for the prompt's logprobs are held and follow it. Content with
neither text nor logprobs is not sent. Whatever the order of arrivals, each choice's content,
joined, is its JSON response's text and logprobs (text_offset included).
"""

from __future__ import annotations

from typing import Any

from nodes.gateway.choices import ChoiceBuilder

Piece = tuple[int, str, dict[str, Any] | None]


class StreamOrder:
    def __init__(self, builders: list[ChoiceBuilder]) -> None:
        self.builders = builders
        self.held: dict[int, list[Any]] = {}

    def start(self, index: int) -> list[Piece]:
        return self._open(self.builders[index])

    def token(self, index: int, token: Any) -> list[Piece]:
        builder = self.builders[index]
        pieces = self._open(builder)
        if builder.awaits_opening:   # echo with logprobs: the prompt's come first
            self.held.setdefault(index, []).append(token)
            return pieces
        return pieces + self._add(builder, token)

    def ended(self) -> list[Piece]:
        return [piece for builder in self.builders for piece in self._open(builder, ended=True)]

    def _open(self, builder: ChoiceBuilder, ended: bool = False) -> list[Piece]:
        """The echo's opening once it can go, then the tokens held back behind it."""
        opening = builder.stream_opening(ended)
        if opening is None:
            return []
        text, logprobs = opening
        pieces: list[Piece] = [(builder.index, text, logprobs)] if text or logprobs else []
        for token in self.held.pop(builder.index, []):
            pieces += self._add(builder, token)
        return pieces

    @staticmethod
    def _add(builder: ChoiceBuilder, token: Any) -> list[Piece]:
        text, logprobs = builder.add(token)
        return [(builder.index, text, logprobs)] if text or logprobs else []
