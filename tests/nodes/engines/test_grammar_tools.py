"""Tool calls end to end without a model: the grammar the gateway builds for tool_choice
"required" or a named function, sampled under masks on a real and a tiny tokenizer, always parses
into one OpenAI tool call whose arguments fit the tool's schema."""

from __future__ import annotations

import contextlib
import json

import pytest

from nodes.engines.grammar import GrammarCompiler
from nodes.engines.model_loader import ModelLoadError, open_model_folder
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.tool_calls import parse_tool_calls, parse_tools
from tests.nodes.engines.grammar_helpers import check_schema, closing_tokens, sample_output
from tests.nodes.gateway.test_tool_calls import NO_PARAMETERS, SEARCH, WEATHER

CHOICES = ["required", {"type": "function", "function": {"name": "get_weather"}}]


def _tokenizers():
    tokenizers = [tiny_tokenizer(512)]
    with contextlib.suppress(ModelLoadError):  # the tiny one alone where the packaged model is absent
        tokenizers.append(open_model_folder("SmolLM2-135M-Instruct").tokenizer)
    return tokenizers


@pytest.mark.parametrize("tool_choice", CHOICES, ids=["required", "named"])
def test_forced_tool_calls_always_parse_and_fit_their_schema(tool_choice):
    config = parse_tools({"tools": [WEATHER, SEARCH, NO_PARAMETERS], "tool_choice": tool_choice})
    schemas = {tool.name: tool.parameters for tool in config.tools}
    for tokenizer in _tokenizers():
        compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
        bonus = closing_tokens(tokenizer, tokenizer.vocab_size)
        for seed in range(6):
            text = tokenizer.decode(sample_output(compiler, config.grammar(), tokenizer, seed, bonus))
            content, calls = parse_tool_calls(text, config.tools, forced=True)
            assert content is None and len(calls) == 1, text
            name = calls[0]["function"]["name"]
            assert config.function in (None, name)
            check_schema(json.loads(calls[0]["function"]["arguments"]), schemas[name])
