"""What a request's output must match: a `GrammarSpec`, plain data (no torch, no grammar library).

Contract: `GrammarSpec(kind, source)` is frozen and hashable (the engine caches compiled grammars
by it), so the gateway can build it and wire bodies can carry it as two strings.
- kinds: "json_object" (any JSON object; `source` ""), "json_schema" (`source` the schema as JSON
  text), "regex" (`source` the pattern, Rust `regex` syntax, matched against the whole output),
  "choice" (`source` a JSON array of strings: the output is exactly one of them).
- `validate()` returns the spec or raises ValueError with a message fit for an API client: unknown
  kind, source not a str or over MAX_GRAMMAR_CHARS, a schema that is not JSON or not a JSON object,
  a choice list that is not 1..MAX_CHOICES strings. What only the grammar library can judge (a
  schema keyword it does not implement, a bad regex) is a ValueError from
  `nodes.engines.grammar.GrammarCompiler.compile` instead.
- `json_object()`, `json_schema(schema)`, `regex(pattern)`, `choice(options)` build valid specs;
  `to_wire()` / `from_wire(body)` are the two-string form ({"kind": ..., "source": ...}).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice")
# Bounds what a client can make an engine compile (compile time grows with the grammar's size);
# 64 KiB holds any realistic schema or tool list.
MAX_GRAMMAR_CHARS = 65536
MAX_CHOICES = 1024


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str
    source: str = ""

    def validate(self) -> GrammarSpec:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"unsupported grammar kind {self.kind!r}; use one of {', '.join(GRAMMAR_KINDS)}")
        if not isinstance(self.source, str):
            raise ValueError(f"a {self.kind} grammar's source must be a string")
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"the {self.kind} grammar is {len(self.source)} characters; "
                             f"at most {MAX_GRAMMAR_CHARS} are accepted")
        if self.kind == "json_object" and self.source:
            raise ValueError("a json_object grammar takes no source")
        if self.kind == "json_schema":
            parse_schema(self.source)
        elif self.kind == "choice":
            parse_choices(self.source)
        return self

    def to_wire(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source}

    @classmethod
    def from_wire(cls, body: Any) -> GrammarSpec:
        if not isinstance(body, Mapping) or set(body) != {"kind", "source"}:
            raise ValueError("a grammar must be an object with exactly 'kind' and 'source'")
        return cls(body["kind"], body["source"]).validate()

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> GrammarSpec:
        source = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
        return cls("json_schema", source).validate()

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern).validate()

    @classmethod
    def choice(cls, options: Sequence[str]) -> GrammarSpec:
        return cls("choice", json.dumps(list(options), ensure_ascii=False)).validate()


def parse_schema(source: str) -> dict[str, Any]:
    """The schema object in `source`, or ValueError."""
    try:
        schema = json.loads(source)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nesting past Python's stack
        raise ValueError(f"the JSON schema is not valid JSON: {_short(exc)}") from None
    if not isinstance(schema, dict):
        raise ValueError("the JSON schema must be a JSON object")
    return schema


def parse_choices(source: str) -> list[str]:
    """The options in a choice grammar's source, or ValueError."""
    try:
        options = json.loads(source)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"the choices are not valid JSON: {_short(exc)}") from None
    if (not isinstance(options, list) or not 1 <= len(options) <= MAX_CHOICES
            or not all(isinstance(option, str) for option in options)):
        raise ValueError(f"the choices must be a list of 1 to {MAX_CHOICES} strings")
    return options


def _short(exc: BaseException) -> str:
    return str(exc)[:200]
