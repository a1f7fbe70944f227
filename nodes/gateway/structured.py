"""What a request asks its output to be (pure): `response_format`, vLLM's `guided_*` fields and
forced tool calls, read into one `GrammarSpec`; and the tools a chat request offers.

Contract: `read_structured(body, chat) -> (GrammarSpec | None, ToolConfig | None)`:
- `response_format`: `{"type": "text"}` (nothing), `{"type": "json_object"}`, or
  `{"type": "json_schema", "json_schema": {"name", "schema": {...}, "strict"}}`;
- vLLM's extensions `guided_json` (a schema object or its JSON text), `guided_regex` (a pattern),
  `guided_choice` (a list of strings);
- chat `tools` / `tool_choice` (nodes/gateway/tool_calls.py): "required" or a named function
  forces a call through a grammar; "auto" offers the tools and parses the output afterwards.
At most one grammar per request (400 naming the fields otherwise). The grammar is compiled
without a tokenizer here (`grammar_check.check_grammar`), so a schema the library cannot serve is a
400 with the library's reason before anything reaches a node.
"""

from __future__ import annotations

import json
from typing import Any

from nodes.engines.grammar_spec import GrammarSpec
from nodes.gateway.api_errors import bad_request
from nodes.gateway.tool_calls import ToolConfig, parse_tools

FIELDS = {"response_format", "guided_json", "guided_regex", "guided_choice", "tools", "tool_choice",
          "parallel_tool_calls"}


def read_structured(body: dict, chat: bool) -> tuple[GrammarSpec | None, ToolConfig | None]:
    tools = parse_tools(body) if chat else None
    if not chat and (body.get("tools") or body.get("tool_choice") is not None):
        raise bad_request("'tools' are a chat completions field", "tools")
    found = [(name, spec) for name, spec in _specs(body) if spec is not None]
    if tools is not None and (forced := tools.grammar()) is not None:
        found.append(("tool_choice", forced))
    if len(found) > 1:
        raise bad_request(f"one output constraint per request, got {', '.join(n for n, _ in found)}", found[1][0])
    if not found:
        return None, tools
    name, spec = found[0]
    _compiles(spec, name)
    return spec, tools


def _specs(body: dict) -> list[tuple[str, GrammarSpec | None]]:
    return [("response_format", _response_format(body.get("response_format"))),
            ("guided_json", _guided_json(body.get("guided_json"))),
            ("guided_regex", _guided(body.get("guided_regex"), "guided_regex", GrammarSpec.regex, str)),
            ("guided_choice", _guided(body.get("guided_choice"), "guided_choice", GrammarSpec.choice, list))]


def _response_format(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind != "json_schema":
        raise bad_request("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                          "response_format")
    inner = value.get("json_schema")
    schema = inner.get("schema") if isinstance(inner, dict) else None
    if not isinstance(schema, dict):
        raise bad_request("'response_format.json_schema.schema' must be a JSON schema object", "response_format")
    return _spec(lambda: GrammarSpec.json_schema(schema), "response_format")


def _guided_json(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict | str):
        raise bad_request("'guided_json' must be a JSON schema (an object or its JSON text)", "guided_json")
    return _spec(lambda: GrammarSpec.json_schema(value if isinstance(value, str) else json.dumps(value)), "guided_json")


def _guided(value: Any, name: str, build: Any, kind: type) -> GrammarSpec | None:
    if value is None:
        return None
    if not isinstance(value, kind):
        raise bad_request(f"'{name}' must be a {'string' if kind is str else 'list of strings'}", name)
    return _spec(lambda: build(value), name)


def _spec(build: Any, name: str) -> GrammarSpec:
    try:
        return build()
    except (ValueError, TypeError) as exc:
        raise bad_request(f"'{name}': {exc}", name) from None


def _compiles(spec: GrammarSpec, name: str) -> None:
    from nodes.engines.grammar_check import check_grammar  # llguidance: only for requests that use it
    try:
        check_grammar(spec)
    except ValueError as exc:
        raise bad_request(f"'{name}' cannot be served: {exc}", name) from None
