"""A `GrammarSpec` as llguidance's grammar, and a compile check that needs no tokenizer and no torch.

Contract: `grammar_text(spec) -> str` is the llguidance grammar the engine compiles for a valid
spec (ValueError for what llguidance refuses while building it); `check_grammar(spec)` validates the
spec and the whole grammar without a tokenizer (an unimplemented schema keyword, a bad regex, an
impossible integer range, a dangling $ref) and raises ValueError with a message for the client, so
the gateway can answer 400 before a request reaches a node. It imports llguidance (no torch).
`guarded(call, *args)` runs a llguidance call turning its Rust panics into ValueError: pyo3 raises
them as PanicException, a BaseException that `except Exception` misses (llguidance 1.9.1 panics
on some schemas with non-ASCII text, e.g. {"required": "é" * 80}, cutting its error message
inside a character).
The output format is fixed here: json.dumps's separators and no other whitespace, so a small model
cannot wander into endless newlines (what a free-whitespace JSON grammar allows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import llguidance

from nodes.engines.grammar_spec import GrammarSpec, parse_choices, parse_schema

JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False,
                # oneOf is read as anyOf (llguidance refuses oneOf otherwise); documented as a limit.
                "coerce_one_of": True}
ANY_OBJECT_SCHEMA = '{"type": "object"}'
MAX_ERROR_CHARS = 300
T = TypeVar("T")


def parser_limits() -> llguidance.LLParserLimits:
    # The defaults bound each mask step (lexer fuel, Earley items) and the grammar's size;
    # verbose_errors=False keeps parser state out of the messages clients see.
    return llguidance.LLParserLimits(verbose_errors=False)


def guarded(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return call(*args, **kwargs)
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise ValueError(f"the grammar library failed on it: {short(str(exc))}") from None


def grammar_text(spec: GrammarSpec) -> str:
    try:
        if spec.kind == "json_object":
            return guarded(llguidance.LLMatcher.grammar_from_json_schema, ANY_OBJECT_SCHEMA, overrides=JSON_OPTIONS)
        if spec.kind == "json_schema":
            schema = parse_schema(spec.source)
            schema.pop("x-guidance", None)  # the library's options stay ours, not the client's
            return guarded(llguidance.LLMatcher.grammar_from_json_schema, schema, overrides=JSON_OPTIONS)
        if spec.kind == "regex":
            return guarded(llguidance.LLMatcher.grammar_from_regex, spec.source)
        return guarded(llguidance.LLMatcher.grammar_from_regex, choice_regex(parse_choices(spec.source)))
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"the {spec.kind} grammar does not compile: {short(str(exc))}") from None


def check_grammar(spec: GrammarSpec) -> None:
    grammar = grammar_text(spec.validate())
    message = guarded(llguidance.LLMatcher.validate_grammar, grammar, None, limits=parser_limits())
    if message and not message.startswith("WARNING"):
        raise ValueError(f"the {spec.kind} grammar does not compile: {short(message)}")


def choice_regex(options: Sequence[str]) -> str:
    # Every character but ASCII letters and digits as \x{..}: no option can be read as regex syntax.
    return "|".join("".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):x}}}" for c in option)
                    or "()" for option in options)


def short(message: str) -> str:
    message = message.split("\n<backtrace>", 1)[0]  # a panic the matcher caught carries a native stack
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
