"""OpenAI tool calling, the pure parts: validate `tools` / `tool_choice`, the grammar that forces a
call, and tool calls parsed out of generated text. No torch, no I/O.

Contract:
- `parse_tools(body) -> ToolConfig`: reads `tools` and `tool_choice` from a chat request body;
  raises the gateway's 400 (`bad_request`, param "tools" or "tool_choice") for anything OpenAI
  would refuse, and for what pdbus bounds: at most MAX_TOOLS tools, names `^[a-zA-Z0-9_-]{1,64}$`
  and unique, descriptions up to MAX_DESCRIPTION_CHARS, `parameters` a JSON-schema object, the
  whole tool list within MAX_GRAMMAR_CHARS as JSON (it becomes one grammar). No `tools` gives
  ToolConfig((), "none"); `tool_choice` defaults to "auto" when there are tools.
- `ToolConfig.offered`: the tools the prompt describes (none under "none").
  `ToolConfig.grammar() -> GrammarSpec | None`: for "required" (any of the tools) or a named
  function, a json_schema spec forcing `{"name": <tool>, "arguments": <its parameters>}`; None for
  "auto" and "none" (the text is parsed afterwards). `ToolConfig.forced` says which.
- `parse_tool_calls(text, tools, *, forced=False) -> (content, tool_calls)`: `<tool_call>{json}
  </tool_call>` blocks (Hermes style, as vLLM's hermes parser reads them), or with `forced` the
  whole text as one bare JSON object, become OpenAI `tool_calls` entries (`call_` + 24 hex digits,
  `arguments` a JSON string); a block that does not parse, or names no offered tool, stays in the
  content. `content` is None when only tool calls remain. Never raises, whatever the text.
The prompt side (describing the tools, rendering tool messages) is nodes/gateway/tool_prompt.py.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from nodes.engines.grammar_spec import MAX_GRAMMAR_CHARS, GrammarSpec
from nodes.gateway.api_errors import bad_request
from nodes.gateway.fields import shown

MAX_TOOLS = 128
MAX_DESCRIPTION_CHARS = 4096
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
CHOICE_MODES = ("none", "auto", "required")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def call_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"name": {"const": self.name}, "arguments": self.parameters},
                "required": ["name", "arguments"], "additionalProperties": False}


@dataclass(frozen=True)
class ToolConfig:
    tools: tuple[Tool, ...]
    choice: str  # "none", "auto", "required" or "function" (one named tool)
    function: str | None = None  # the named tool when choice == "function"

    @property
    def offered(self) -> tuple[Tool, ...]:
        return () if self.choice == "none" else self.tools

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def grammar(self) -> GrammarSpec | None:
        if not self.forced:
            return None
        chosen = [t for t in self.tools if self.choice == "required" or t.name == self.function]
        schemas = [t.call_schema() for t in chosen]
        return GrammarSpec.json_schema(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})


def parse_tools(body: dict[str, Any]) -> ToolConfig:
    raw_tools, raw_choice = body.get("tools"), body.get("tool_choice")
    if raw_tools is None:
        if raw_choice not in (None, "none"):
            raise bad_request("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
        return ToolConfig((), "none")
    if not isinstance(raw_tools, list) or not 1 <= len(raw_tools) <= MAX_TOOLS:
        raise bad_request(f"'tools' must be a list of 1 to {MAX_TOOLS} tools", "tools")
    tools = tuple(_tool(raw, index) for index, raw in enumerate(raw_tools))
    names = [tool.name for tool in tools]
    if len(set(names)) != len(names):
        raise bad_request("tool names must be unique", "tools")
    if len(json.dumps([t.as_openai() for t in tools], ensure_ascii=False)) > MAX_GRAMMAR_CHARS:
        raise bad_request(f"the tools take more than {MAX_GRAMMAR_CHARS} characters as JSON", "tools")
    return _choice(raw_choice, tools)


def _tool(raw: Any, index: int) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(raw.get("function"), dict):
        raise bad_request(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad_request(f"{where}.function.name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {shown(name)}", "tools")
    description = function.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
        raise bad_request(f"{where}.function.description must be a string of at most "
                          f"{MAX_DESCRIPTION_CHARS} characters", "tools")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise bad_request(f"{where}.function.parameters must be a JSON schema object", "tools")
    try:
        json.dumps(parameters, ensure_ascii=False).encode()
    except (TypeError, ValueError, UnicodeEncodeError):  # not JSON data, or a lone surrogate
        raise bad_request(f"{where}.function.parameters is not valid JSON text", "tools") from None
    return Tool(name, description, parameters)


def _choice(raw: Any, tools: tuple[Tool, ...]) -> ToolConfig:
    if raw is None:
        return ToolConfig(tools, "auto")
    if isinstance(raw, str):
        if raw not in CHOICE_MODES:
            raise bad_request(f"'tool_choice' must be one of {', '.join(CHOICE_MODES)} or a named function, "
                              f"got {shown(raw)}", "tool_choice")
        return ToolConfig(tools, raw)
    function = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request("'tool_choice' must be a string or {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}", "tool_choice")
    if name not in {tool.name for tool in tools}:
        raise bad_request(f"'tool_choice' names {shown(name)}, which is not in 'tools'", "tool_choice")
    return ToolConfig(tools, "function", name)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_tool_calls(text: str, tools: tuple[Tool, ...], *, forced: bool = False
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    names = {tool.name for tool in tools}
    if forced:
        call = _call(text, names)
        return (None, [call]) if call else (text, [])
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        call = _call(match.group(1), names)
        if call is None:
            return match.group(0)  # malformed: left in the content as written
        calls.append(call)
        return ""

    content = _BLOCK.sub(take, text)
    if calls and not content.strip():
        return None, calls
    return (content.strip() if calls else content), calls


def _call(text: str, names: set[str]) -> dict[str, Any] | None:
    """One OpenAI tool call from `{"name": ..., "arguments": {...}}` text, or None."""
    value = _json(text)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or value["name"] not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments already as a JSON string
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    encoded = json.dumps(arguments, ensure_ascii=False)
    try:
        encoded.encode()
    except UnicodeEncodeError:  # a "\ud800" escape decoded to a lone surrogate: keep it escaped
        encoded = json.dumps(arguments)
    return {"id": new_call_id(), "type": "function", "function": {"name": value["name"], "arguments": encoded}}


def _json(text: str) -> Any:
    """The JSON value in `text`, or None. NaN and Infinity are refused: they are not JSON."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
