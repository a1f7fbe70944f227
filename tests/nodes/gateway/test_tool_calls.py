"""Tool calling, the pure parts (nodes/gateway/tool_calls.py): what `tools` / `tool_choice` accept
and refuse, the grammar each choice forces, and parsing calls out of any text without raising."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.grammar_check import check_grammar
from nodes.gateway.api_errors import ApiError
from nodes.gateway.tool_calls import MAX_TOOLS, parse_tool_calls, parse_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "web-search_2", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
NO_PARAMETERS = {"type": "function", "function": {"name": "now"}}
TOOLS = parse_tools({"tools": [WEATHER, SEARCH, NO_PARAMETERS]}).tools
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def refused(body, param):
    with pytest.raises(ApiError) as caught:
        parse_tools(body)
    assert caught.value.status == 400 and caught.value.param == param
    return caught.value.message


def test_no_tools_means_no_tool_calling():
    config = parse_tools({})
    assert config.tools == () and config.choice == "none" and config.grammar() is None
    assert parse_tools({"tool_choice": "none"}).choice == "none"


def test_tools_default_to_auto_and_keep_their_fields():
    config = parse_tools({"tools": [WEATHER, NO_PARAMETERS]})
    assert config.choice == "auto" and not config.forced and config.grammar() is None
    assert config.offered == config.tools
    weather, now = config.tools
    assert weather.as_openai() == WEATHER
    assert now.parameters == {"type": "object", "properties": {}} and now.description == ""


def test_tool_choice_none_offers_no_tools():
    config = parse_tools({"tools": [WEATHER], "tool_choice": "none"})
    assert config.offered == () and config.grammar() is None


def test_required_forces_one_of_the_tools():
    config = parse_tools({"tools": [WEATHER, SEARCH], "tool_choice": "required"})
    schema = json.loads(config.grammar().source)
    assert config.forced and [o["properties"]["name"] for o in schema["anyOf"]] == [
        {"const": "get_weather"}, {"const": "web-search_2"}]
    assert schema["anyOf"][0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    check_grammar(config.grammar())


def test_a_named_function_forces_that_function():
    config = parse_tools({"tools": [WEATHER, SEARCH],
                          "tool_choice": {"type": "function", "function": {"name": "web-search_2"}}})
    assert (config.choice, config.function, config.forced) == ("function", "web-search_2", True)
    schema = json.loads(config.grammar().source)
    assert schema["properties"]["name"] == {"const": "web-search_2"} and schema["additionalProperties"] is False
    check_grammar(config.grammar())
    single = parse_tools({"tools": [NO_PARAMETERS], "tool_choice": "required"})
    assert json.loads(single.grammar().source)["properties"]["name"] == {"const": "now"}


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"tool_choice": "auto"}, "tool_choice", "only allowed"),
    ({"tools": {}}, "tools", "list of 1 to"),
    ({"tools": []}, "tools", "list of 1 to"),
    ({"tools": [WEATHER] * (MAX_TOOLS + 1)}, "tools", "list of 1 to"),
    ({"tools": ["get_weather"]}, "tools", "must be"),
    ({"tools": [{"type": "code", "function": WEATHER["function"]}]}, "tools", "must be"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "must match"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools", "must match"),
    ({"tools": [{"type": "function", "function": {"name": "café"}}]}, "tools", "must match"),
    ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools", "must match"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]}, "tools", "description"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "d" * 5000}}]}, "tools", "description"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "JSON schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"d": "\ud800"}}}]}, "tools", "valid JSON"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}", "description": "d" * 4000}}
                for i in range(20)]}, "tools", "characters"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "must be one of"),
    ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice", "must be a string"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "must be a string"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice",
     "not in 'tools'"),
])
def test_invalid_tools_and_choices_are_400s(body, param, words):
    assert words in refused(body, param)


def test_hermes_blocks_become_tool_calls():
    text = ('I will check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>{"name": "now", "arguments": {}}</tool_call>')
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "I will check."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert all(c["type"] == "function" and CALL_ID.fullmatch(c["id"]) for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_only_tool_calls_give_null_content():
    content, calls = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>\n', TOOLS)
    assert content is None and calls[0]["function"]["arguments"] == "{}"


def test_arguments_given_as_a_json_string_or_as_parameters_are_read():
    for body in ('{"name": "now", "arguments": "{\\"a\\": 1}"}', '{"name": "now", "parameters": {"a": 1}}'):
        _, calls = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
        assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1}


@pytest.mark.parametrize("block", [
    "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # not an offered tool
    '<tool_call>{"name": ["now"], "arguments": {}}</tool_call>',
    '<tool_call>{"name": "now", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "now", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "now", "arguments": {"x": NaN}}</tool_call>',
    '<tool_call>{"name": "now", "arguments": {}}',  # cut off by max_tokens
    "<tool_call>" + "[" * 5000 + "</tool_call>",
])
def test_malformed_blocks_stay_in_the_content(block):
    text = f"before {block} after"
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_a_forced_output_is_one_bare_json_object():
    content, calls = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}',
                                      TOOLS, forced=True)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "c"}
    assert parse_tool_calls('{"name": "get_weather", "argu', TOOLS, forced=True) == ('{"name": "get_weather", "argu', [])


def test_lone_surrogates_in_arguments_stay_escaped():
    _, calls = parse_tool_calls('<tool_call>{"name": "now", "arguments": {"s": "\\ud800"}}</tool_call>', TOOLS)
    calls[0]["function"]["arguments"].encode()  # carriable as UTF-8
    assert json.loads(calls[0]["function"]["arguments"]) == {"s": "\ud800"}


FRAGMENTS = st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call", "{", "}", '"name"', '"arguments"', ":",
                             ",", '"now"', '"get_weather"', "{}", "[", "]", "NaN", "\\u", "\n", " ", "text"])


@settings(max_examples=500, deadline=None)
@given(text=st.one_of(st.text(max_size=400), st.lists(FRAGMENTS, max_size=60).map("".join)),
       forced=st.booleans())
def test_any_text_parses_without_raising(text, forced):
    content, calls = parse_tool_calls(text, TOOLS, forced=forced)
    assert content is None or isinstance(content, str)
    for call in calls:
        assert call["function"]["name"] in {"get_weather", "web-search_2", "now"}
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    if not calls:
        assert content == text


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(["get_weather", "web-search_2", "now"]),
                                st.dictionaries(st.text(max_size=6), json_values, max_size=4)), min_size=1, max_size=4),
       prefix=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=30))
def test_written_calls_parse_back_to_the_same_calls(calls, prefix):
    blocks = [f"<tool_call>\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n</tool_call>"
              for n, a in calls]
    content, parsed = parse_tool_calls(prefix + "\n".join(blocks), TOOLS)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == calls
    assert content == (prefix.strip() or None)
