"""The prompt side of tool calling (nodes/gateway/tool_prompt.py): tool-aware templates get
`tools=` and Hugging Face-shaped messages; others (SmolLM2's) get the tools described in a system
message and calls / results as Hermes-style text. Malformed tool messages are 400s."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from nodes.engines.tiny import CHATML_TEMPLATE
from nodes.gateway.api_errors import ApiError
from nodes.gateway.tool_calls import parse_tools
from nodes.gateway.tool_prompt import render_prompt, template_messages, template_uses_tools
from tests.nodes.gateway.test_tool_calls import SEARCH, WEATHER

SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's, as its GGUF carries it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOL_TEMPLATE = (  # shaped like Qwen2.5's: tools in the system turn, calls and results as tags
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response name=\"{{ message.name }}\">\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "web-search_2", "arguments": '{"query": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "Paris is in France"}]},
    {"role": "user", "content": "Thanks"},
]


@dataclass
class FakeTokenizer:
    chat_template_source: str | None
    special_tokens: dict = field(default_factory=lambda: {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})


def refused(messages):
    with pytest.raises(ApiError) as caught:
        template_messages(messages, native=False)
    assert caught.value.status == 400 and caught.value.param == "messages"
    return caught.value.message


def test_which_templates_use_tools():
    assert template_uses_tools(TOOL_TEMPLATE)
    assert not template_uses_tools(SMOLLM2_TEMPLATE) and not template_uses_tools(CHATML_TEMPLATE)
    assert not template_uses_tools("{% if %}")  # broken: rendering reports it


def test_smollm2_gets_the_tools_in_a_system_message_and_hermes_text():
    prompt = render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE), CONVERSATION, parse_tools({"tools": [WEATHER, SEARCH]}))
    assert prompt.startswith("<|im_start|>system\nYou are a function calling AI model.")
    assert "named SmolLM" not in prompt  # our system message replaces the template's default one
    assert json.dumps(WEATHER) in prompt and "<tool_call></tool_call> tags" in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "web-search_2", "arguments": {"query": "Paris"}}\n</tool_call>'
            '<|im_end|>') in prompt
    assert ('<|im_start|>user\n<tool_response>\n{"name": "get_weather", "content": "18 C"}\n</tool_response>\n'
            '<tool_response>\n{"name": "web-search_2", "content": "Paris is in France"}\n</tool_response><|im_end|>\n'
            '<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n') in prompt


def test_the_requests_own_system_message_keeps_its_text_first():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE), messages, parse_tools({"tools": [WEATHER]}))
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nYou are a function calling AI model.")
    assert prompt.count("<|im_start|>system") == 1


def test_forced_choices_ask_for_the_bare_object_the_grammar_forces():
    messages = [{"role": "user", "content": "Hi"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    prompt = render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE), messages,
                           parse_tools({"tools": [WEATHER, SEARCH], "tool_choice": named}))
    assert "Call the function get_weather now. Reply with only a JSON object" in prompt
    prompt = render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE), messages,
                           parse_tools({"tools": [WEATHER], "tool_choice": "required"}))
    assert "Call one of these functions now." in prompt and "<tool_call></tool_call> tags" not in prompt


def test_tool_choice_none_describes_no_tools_but_renders_the_history():
    prompt = render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE), CONVERSATION,
                           parse_tools({"tools": [WEATHER], "tool_choice": "none"}))
    assert "<tools>" not in prompt and "named SmolLM" in prompt and "<tool_response>" in prompt


def test_a_tool_aware_template_gets_tools_and_hugging_face_messages():
    config = parse_tools({"tools": [WEATHER, SEARCH]})
    prompt = render_prompt(FakeTokenizer(TOOL_TEMPLATE), CONVERSATION, config)
    assert prompt.startswith("<|im_start|>system\n<tools>" + json.dumps(WEATHER))  # trim_blocks: no newline
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response name="web-search_2">\nParis is in France\n</tool_response>' in prompt
    assert "You are a function calling AI model" not in prompt
    converted = template_messages(CONVERSATION, native=True)
    assert converted[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert converted[2] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C"}


def test_plain_conversations_are_unchanged():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
                {"role": "assistant", "content": "b"}, {"role": "developer", "content": "d"}]
    expected = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "developer", "content": "d"}]
    assert template_messages(messages, native=False) == template_messages(messages, native=True) == expected
    assert render_prompt(FakeTokenizer(CHATML_TEMPLATE), messages, parse_tools({})) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
        "<|im_start|>developer\nd<|im_end|>\n<|im_start|>assistant\n")


def test_a_tool_result_for_an_unknown_call_keeps_its_own_name():
    converted = template_messages([{"role": "tool", "tool_call_id": "x", "name": "legacy", "content": "r"}],
                                  native=True)
    assert converted == [{"role": "tool", "tool_call_id": "x", "name": "legacy", "content": "r"}]


@pytest.mark.parametrize(("messages", "words"), [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    ([{"role": "robot", "content": "x"}], "needs a role"),
    (["x"], "needs a role"),
    ([{"role": "user"}], "content must be"),
    ([{"role": "user", "content": None}], "content must be"),
    ([{"role": "assistant", "content": None}], "content must be"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "content must be"),
    ([{"role": "tool", "content": "r"}], "tool_call_id"),
    ([{"role": "assistant", "tool_calls": {}}], "must be a list"),
    ([{"role": "assistant", "tool_calls": [{"id": "a"}]}], "need an 'id'"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]}], "need an 'id'"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[1]"}}]}],
     "JSON object"),
    ([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{"}}]}],
     "JSON object"),
])
def test_malformed_messages_are_400s(messages, words):
    assert words in refused(messages)


def test_a_template_that_refuses_the_conversation_is_a_400():
    strict = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}x"
    with pytest.raises(ApiError, match="user first"):
        render_prompt(FakeTokenizer(strict), [{"role": "assistant", "content": "a"}], parse_tools({}))
    with pytest.raises(ApiError, match="no chat template"):
        render_prompt(FakeTokenizer(None), [{"role": "user", "content": "a"}], parse_tools({}))


@pytest.mark.real_model
def test_smollm2s_real_template_is_the_one_tested_here():
    from nodes.engines.model_loader import ModelLoadError, open_model_folder
    try:
        tokenizer = open_model_folder("SmolLM2-135M-Instruct").tokenizer
    except ModelLoadError as exc:
        pytest.skip(f"SmolLM2-135M-Instruct is not available: {exc}")
    assert tokenizer.chat_template_source == SMOLLM2_TEMPLATE
    prompt = render_prompt(tokenizer, CONVERSATION, parse_tools({"tools": [WEATHER]}))
    assert prompt == render_prompt(FakeTokenizer(SMOLLM2_TEMPLATE, tokenizer.special_tokens), CONVERSATION,
                                   parse_tools({"tools": [WEATHER]}))
