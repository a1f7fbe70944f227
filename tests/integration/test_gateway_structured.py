"""Structured output and tool calls through the `openai` package and raw HTTP, in front of a real
tiny-model cluster (1 prefill + 1 decode, raw KV): whatever the random weights say, the output
matches the requested JSON schema, regex or choice (the prefill node's first token and the decode
node's rest under one grammar); forced tool calls come back parsed; a schema the grammar library
cannot serve is a 400 naming the field; and a JSON stream whose decode node is killed mid-stream
resumes with the fault-free text, still valid JSON."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "sunny": {"type": "boolean"}},
          "required": ["city", "sunny"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                                                           "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_always_parses(client, temperature):
    completion = client.chat.completions.create(
        model=TINY_NAME, messages=MESSAGES, max_tokens=64, temperature=temperature, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}})
    choice = completion.choices[0]
    value = json.loads(choice.message.content)
    assert choice.finish_reason == "stop" and set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool)


def test_json_object_regex_and_choice(served, client):
    text = client.completions.create(model=TINY_NAME, prompt="Data:", max_tokens=48, temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}}).choices[0].text
    assert isinstance(json.loads(text), dict)
    url = served[1].url + "/v1/completions"
    regex = httpx.post(url, json={"model": TINY_NAME, "prompt": "Code:", "max_tokens": 16,
                                  "guided_regex": "[A-Z]{2}-[0-9]{3}"}, timeout=60).json()["choices"][0]["text"]
    assert len(regex) == 6 and regex[:2].isupper() and regex[2] == "-" and regex[3:].isdigit()
    choice = httpx.post(url, json={"model": TINY_NAME, "prompt": "Answer:", "max_tokens": 8, "n": 3,
                                   "temperature": 1.0, "guided_choice": ["yes", "no"]}, timeout=60).json()
    assert all(c["text"] in ("yes", "no") for c in choice["choices"])


def test_a_forced_tool_call_comes_back_parsed(client):
    completion = client.chat.completions.create(model=TINY_NAME, messages=MESSAGES, tools=[WEATHER],
                                                tool_choice="required", max_tokens=48, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    streamed = list(client.chat.completions.create(model=TINY_NAME, messages=MESSAGES, tools=[WEATHER],
                                                   tool_choice={"type": "function",
                                                                "function": {"name": "get_weather"}},
                                                   max_tokens=48, temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in streamed if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and deltas[0].tool_calls[0].function.arguments == call.function.arguments
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_result_conversation_renders(client):
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    completion = client.chat.completions.create(model=TINY_NAME, messages=messages, tools=[WEATHER], max_tokens=8,
                                                temperature=0, extra_body={"ignore_eos": True})
    assert completion.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert completion.usage.prompt_tokens > 40   # the tools' description and the tool result are in the prompt


def test_what_cannot_be_served_is_a_400_naming_the_field(served):
    url = served[1].url + "/v1/chat/completions"
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string",
                                                                                     "pattern": "(("}}}},
              "response_format"),
             ({"response_format": {"type": "xml"}}, "response_format"),
             ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
             ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools")]
    for extra, param in cases:
        response = httpx.post(url, json={"model": TINY_NAME, "messages": MESSAGES, **extra}, timeout=30)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (extra, response.text)


def test_a_json_stream_resumes_exactly_after_its_decode_node_dies():
    slow = {"decode": ["--test-step-delay-ms", "25"]}
    body = {"model": TINY_NAME, "prompt": "Record:", "max_tokens": 60, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}
    with gateway_cluster(num_decode=2, extra_args=slow) as (cluster, gateway):
        url = f"{gateway.url}/v1/completions"
        expected = httpx.post(url, json=body, timeout=60).json()["choices"][0]["text"]
        text, info = "", {}
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
            serving = response.headers["X-Pdbus-Decode-Node"]
            for number, line in enumerate(line for line in response.iter_lines() if line.startswith("data: {")):
                chunk = json.loads(line[6:])
                text += "".join(c["text"] for c in chunk["choices"])
                info = chunk.get("pdbus", info)
                if number == 4:
                    cluster.kill(serving)
        assert text == expected and info["failover"]
        assert set(json.loads(text)) == {"city", "sunny"}
