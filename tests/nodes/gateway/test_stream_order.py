"""A stream's content order (nodes/gateway/stream_order.py), for any interleaving of n choices'
tokens and any moment the prompt's logprobs arrive (or none): each choice's streamed content,
joined, equals the choice a JSON response builds from the same tokens, and a streamed echo comes
before the choice's first token."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.cluster.results import StreamToken
from nodes.engines.engine_types import TokenLogprobs
from nodes.engines.model_loader import TINY_VOCAB_SIZE
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.choices import ChoiceBuilder
from nodes.gateway.stream_order import StreamOrder

TOKENIZER = tiny_tokenizer(TINY_VOCAB_SIZE)
PROMPT = (40, 41, 42, 43)
PROMPT_LOGPROBS = (None, TokenLogprobs(-1.0, ((41, -1.0),)), TokenLogprobs(-2.0), TokenLogprobs(-0.5))


@dataclass
class FakeGeneration:
    prompt: tuple[int, ...] = PROMPT
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = field(default_factory=tuple)


def api(echo: bool, logprobs: int | None, max_tokens: int) -> Any:
    return SimpleNamespace(echo=echo, logprobs=logprobs, max_tokens=max_tokens, chat=False, tools=None,
                           prompt=None)


def tokens_of(ids: list[int]) -> list[StreamToken]:
    return [StreamToken(i, t, TOKENIZER.decode([t]), TokenLogprobs(-0.25 * (i + 1), ((t, -0.1),)))
            for i, t in enumerate(ids)]


def joined(pieces: list[tuple[int, str, Any]], index: int) -> tuple[str, dict[str, list[Any]] | None]:
    mine = [(text, logprobs) for i, text, logprobs in pieces if i == index]
    fields = [logprobs for _, logprobs in mine if logprobs is not None]
    merged = {key: [v for f in fields for v in f[key]] for key in fields[0]} if fields else None
    return "".join(text for text, _ in mine), merged


@settings(max_examples=60, deadline=None)
@given(choices=st.lists(st.lists(st.integers(5, 400), max_size=5), min_size=1, max_size=3),
       echo=st.booleans(), logprobs=st.sampled_from([None, 1]), scoring_only=st.booleans(),
       order_seed=st.randoms(use_true_random=False), arrive_at=st.integers(-1, 16))
def test_joined_stream_content_equals_the_json_choice(choices, echo, logprobs, scoring_only, order_seed,
                                                      arrive_at):
    request = api(echo, logprobs, 0 if echo and scoring_only else 4)
    generations = [FakeGeneration() for _ in choices]
    order = StreamOrder([ChoiceBuilder(i, request, g, TOKENIZER) for i, g in enumerate(generations)])
    arrivals = _interleaved(choices, order_seed)   # each choice's tokens in order, choices mixed at random
    pieces = [piece for i in range(len(choices)) for piece in order.start(i)]
    for step, (index, token) in enumerate(arrivals):
        if step == arrive_at:   # the FINAL carrying the prompt's logprobs came in before this token
            for g in generations:
                g.prompt_logprobs = PROMPT_LOGPROBS
        pieces += order.token(index, token)
    pieces += order.ended()
    for index, ids in enumerate(choices):
        whole = ChoiceBuilder(index, request, generations[index], TOKENIZER)
        for token in tokens_of(ids):
            whole.add(token)
        whole.opening()
        expected = whole.choice("length")
        text, fields = joined(pieces, index)
        assert text == expected.text
        assert fields == expected.logprobs or (fields is None and not any((expected.logprobs or {}).values()))
        if echo and any(i == index for i, _, _ in pieces):
            first = next(p for p in pieces if p[0] == index)
            assert first[1] == TOKENIZER.decode(list(PROMPT))   # the echo leads


def _interleaved(choices: list[list[int]], rng: Any) -> list[tuple[int, StreamToken]]:
    queues = [tokens_of(ids) for ids in choices]
    out = []
    while any(queues):
        index = rng.choice([i for i, q in enumerate(queues) if q])
        out.append((index, queues[index].pop(0)))
    return out
