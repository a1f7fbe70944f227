"""The prompt side of tool calling (pure): OpenAI messages with tool calls and tool results turned
into what the model's chat template renders, and the tools described to the model.

Contract:
- `template_uses_tools(source) -> bool`: the Jinja template reads a `tools` variable (as tool-aware
  templates do; transformers passes `tools=` to them). SmolLM2-135M-Instruct's does not.
- `template_messages(messages, *, native) -> list[dict]`: validates and converts OpenAI chat
  messages (system / developer / user / assistant with optional `tool_calls` / tool with
  `tool_call_id`; content a string, text parts or, for an assistant calling tools, null).
  native=True: the Hugging Face convention tool-aware templates expect (an assistant's
  `tool_calls[i].function.arguments` as a dict; tool messages keep role "tool", with the called
  function's `name`). native=False: plain text in the Hermes format the injected prompt teaches:
  an assistant's calls become `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` lines
  after its text, and each run of tool messages one user message of `<tool_response>` blocks.
  Anything malformed is the gateway's 400 with param "messages".
- `render_prompt(tokenizer, messages, config) -> str`: the prompt text for a chat request with
  `config` (a `ToolConfig`). A tool-aware template gets `tools=`; otherwise, when tools are offered,
  a system message describing them and the output format goes first (or is appended to the
  request's own system message). `tokenizer` needs only `chat_template_source` and `special_tokens`.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Protocol

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols

from nodes.engines.chat_template import ChatTemplate, ChatTemplateError
from nodes.gateway.api_errors import bad_request
from nodes.gateway.fields import shown
from nodes.gateway.tool_calls import MAX_TOOLS, ToolConfig

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOLS_PROMPT = (
    "You are a function calling AI model. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the available "
    "tools:\n<tools>\n{tools}\n</tools>\n")
AUTO_FORMAT = (
    "For each function call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>")
FORCED_FORMAT = (
    "Call {which} now. Reply with only a JSON object with the function name and arguments:\n"
    "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}")


class ChatTokenizer(Protocol):
    chat_template_source: str | None
    special_tokens: dict[str, str | None]


@functools.lru_cache(maxsize=16)
def template_uses_tools(source: str) -> bool:
    try:
        parsed = jinja2.Environment(extensions=[loopcontrols]).parse(source)
    except jinja2.TemplateError:
        return False  # rendering it reports the error
    return "tools" in meta.find_undeclared_variables(parsed)


@functools.lru_cache(maxsize=16)
def _template(source: str) -> ChatTemplate:
    return ChatTemplate(source)


def render_prompt(tokenizer: ChatTokenizer, messages: Any, config: ToolConfig) -> str:
    source = tokenizer.chat_template_source
    if not source:
        raise bad_request("this model has no chat template; send a plain prompt instead", "messages")
    native = template_uses_tools(source)
    converted = template_messages(messages, native=native)
    extra: dict[str, Any] = {}
    if config.offered and native:
        extra["tools"] = [tool.as_openai() for tool in config.offered]
    elif config.offered:
        converted = _with_system_text(converted, tools_system_prompt(config))
    special = {k: v for k, v in tokenizer.special_tokens.items() if k not in extra}
    try:
        return _template(source).render(converted, add_generation_prompt=True, **special, **extra)
    except ChatTemplateError as exc:
        raise bad_request(f"the messages do not fit the model's chat template: {exc}", "messages") from None


def tools_system_prompt(config: ToolConfig) -> str:
    listed = "\n".join(json.dumps(tool.as_openai(), ensure_ascii=False) for tool in config.offered)
    if not config.forced:
        return TOOLS_PROMPT.format(tools=listed) + AUTO_FORMAT
    which = f"the function {config.function}" if config.function else "one of these functions"
    return TOOLS_PROMPT.format(tools=listed) + FORCED_FORMAT.format(which=which)


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{text}".lstrip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def template_messages(messages: Any, *, native: bool) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    converted: list[dict[str, Any]] = []
    called: dict[str, str] = {}  # tool call id -> function name, for the tool messages that answer
    in_tool_run = False  # the last message converted was a tool result
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"messages[{index}] needs a role of {', '.join(ROLES)}", "messages")
        role = message["role"]
        calls = _tool_calls(message.get("tool_calls"), index) if role == "assistant" else []
        content = _content(message.get("content"), index, optional=bool(calls))
        called.update((call_id, name) for call_id, name, _ in calls)
        was_in_tool_run, in_tool_run = in_tool_run, role == "tool"
        if role == "tool":
            result = _tool_result(message, content, called, index)
            if native:
                converted.append(result)
            elif was_in_tool_run:  # a run of tool results is one user turn
                converted[-1]["content"] += "\n" + _response_block(result)
            else:
                converted.append({"role": "user", "content": _response_block(result)})
        elif calls:
            converted.append(_assistant_calls(content, calls, native))
        else:
            converted.append({"role": role, "content": content})
    return converted


def _content(content: Any, index: int, *, optional: bool) -> str:
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts", "messages")


def _tool_calls(raw: Any, index: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, name, arguments) of an assistant message's `tool_calls`."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad_request(f"messages[{index}].tool_calls must be a list of at most {MAX_TOOLS} calls", "messages")
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if (not isinstance(function, dict) or not isinstance(call.get("id"), str)
                or not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str)):
            raise bad_request(f"messages[{index}].tool_calls entries need an 'id' and a 'function' with "
                              "string 'name' and 'arguments'", "messages")
        calls.append((call["id"], function["name"], _arguments(function["arguments"], index)))
    return calls


def _arguments(text: str, index: int) -> dict[str, Any]:
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        raise bad_request(f"messages[{index}].tool_calls arguments must be a JSON object, got {shown(text)}",
                          "messages")
    return arguments


def _assistant_calls(content: str, calls: list[tuple[str, str, dict[str, Any]]], native: bool) -> dict[str, Any]:
    if native:
        return {"role": "assistant", "content": content, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls]}
    blocks = [f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"
              for _, name, arguments in calls]
    return {"role": "assistant", "content": "\n".join([content, *blocks] if content else blocks)}


def _tool_result(message: dict[str, Any], content: str, called: dict[str, str], index: int) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise bad_request(f"messages[{index}] (role tool) needs a string 'tool_call_id'", "messages")
    name = called.get(call_id, message.get("name") if isinstance(message.get("name"), str) else "")
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _response_block(result: dict[str, Any]) -> str:
    body = json.dumps({"name": result["name"], "content": result["content"]}, ensure_ascii=False)
    return f"<tool_response>\n{body}\n</tool_response>"
