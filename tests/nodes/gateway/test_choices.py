"""A choice built from its stream (nodes/gateway/choices.py): a streamed echo's opening comes once,
first, and with logprobs only when the prompt's logprobs are in (or the stream ended), so the
chunks a client joins equal the JSON response's choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from nodes.cluster.results import StreamToken
from nodes.engines.engine_types import TokenLogprobs
from nodes.engines.model_loader import TINY_VOCAB_SIZE
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.choices import ChoiceBuilder

TOKENIZER = tiny_tokenizer(TINY_VOCAB_SIZE)
PROMPT = (40, 41, 42)


@dataclass
class FakeGeneration:
    prompt: tuple[int, ...] = PROMPT
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = field(default_factory=tuple)


def api(echo: bool = True, logprobs: int | None = 1, max_tokens: int = 4) -> Any:
    return SimpleNamespace(echo=echo, logprobs=logprobs, max_tokens=max_tokens, chat=False, tools=None,
                           prompt=None)


def tokens(*ids: int) -> list[StreamToken]:
    return [StreamToken(i, t, TOKENIZER.decode([t]), TokenLogprobs(-0.5 - i)) for i, t in enumerate(ids)]


def joined(fields: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {key: [v for f in fields for v in f[key]] for key in fields[0]}


def test_echo_with_logprobs_waits_for_the_prompt_logprobs_then_matches_the_json_choice():
    generation = FakeGeneration()
    builder = ChoiceBuilder(0, api(), generation, TOKENIZER)
    assert builder.awaits_opening and builder.stream_opening() is None   # no prompt logprobs yet
    generation.prompt_logprobs = (None, TokenLogprobs(-1.0), TokenLogprobs(-2.0))
    text, opening = builder.stream_opening()
    assert text == TOKENIZER.decode(list(PROMPT)) and opening["token_logprobs"] == [None, -1.0, -2.0]
    assert not builder.awaits_opening and builder.stream_opening() is None   # once
    streamed = [opening] + [builder.add(t)[1] for t in tokens(7, 8)]

    whole = ChoiceBuilder(0, api(), generation, TOKENIZER)
    for token in tokens(7, 8):
        whole.add(token)
    whole.opening()
    choice = whole.choice("length")
    assert joined(streamed) == choice.logprobs
    assert text + "".join(builder.texts) == choice.text


def test_a_stream_that_ended_without_prompt_logprobs_still_opens_with_none_for_each():
    builder = ChoiceBuilder(0, api(), FakeGeneration(), TOKENIZER)
    text, opening = builder.stream_opening(ended=True)
    assert opening["token_logprobs"] == [None, None, None] and opening["text_offset"][0] == 0


@pytest.mark.parametrize("echo, logprobs, expected", [(True, None, True), (False, 1, False), (False, None, False)])
def test_without_logprobs_the_opening_goes_at_once_and_without_echo_there_is_none(echo, logprobs, expected):
    builder = ChoiceBuilder(0, api(echo=echo, logprobs=logprobs), FakeGeneration(), TOKENIZER)
    opening = builder.stream_opening()
    assert (opening is not None) == expected and not builder.awaits_opening
    if expected:
        assert opening == (TOKENIZER.decode(list(PROMPT)), None)


def test_scoring_only_streams_the_prompt_and_drops_the_generated_token():
    generation = FakeGeneration(prompt_logprobs=(None, TokenLogprobs(-1.0), TokenLogprobs(-2.0)))
    builder = ChoiceBuilder(0, api(max_tokens=0), generation, TOKENIZER)
    assert builder.stream_opening() is not None
    assert builder.add(tokens(9)[0]) == ("", None)
    assert builder.choice("stop").finish_reason == "length"
