"""Helpers for the grammar tests: masked random sampling, and a JSON-schema check by hand.

`sample_output(compiler, spec, tokenizer, seed)` runs the loop an engine runs (random logits ->
`apply_masks` -> pick -> `accept`) until the grammar terminates; it returns the tokens (EOS
excluded), asserting every pick was accepted. The pick is the argmax of i.i.d. random logits, i.e. a
uniformly random allowed token; past `CLOSE_AFTER` steps tokens holding a closing character get a
bonus, so a long random string still ends in bounded time. `check_schema(value, schema)` checks the
keywords the tests' schemas use (and, where the jsonschema package happens to be installed,
validates with it too).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from nodes.engines.grammar import GrammarCompiler, apply_masks
from nodes.engines.grammar_spec import GrammarSpec

MAX_STEPS = 6000
CLOSE_AFTER = 300
CLOSERS = ('"', "}", "]", ",")


def closing_tokens(tokenizer: Any, vocab_size: int) -> torch.Tensor:
    bonus = torch.zeros(vocab_size)
    for token in range(tokenizer.vocab_size):
        if any(c in tokenizer.decode([token]) for c in CLOSERS):
            bonus[token] = 4.0
    return bonus


def sample_output(compiler: GrammarCompiler, spec: GrammarSpec, tokenizer: Any, seed: int,
                  bonus: torch.Tensor | None = None) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    state, tokens = compiler.new_state(spec), []
    for step in range(MAX_STEPS):
        logits = torch.randn(2, compiler.vocab_size, generator=generator)
        if bonus is not None and step >= CLOSE_AFTER:
            logits[1] += bonus
        untouched = logits[0].clone()
        apply_masks(logits, [None, state])
        assert torch.equal(logits[0], untouched)
        token = int(logits[1].argmax())
        assert state.accept(token), f"sampled token {token} was refused at step {step}"
        if token not in tokenizer.eos_token_ids:
            tokens.append(token)
        if state.is_terminated():
            return tokens
    raise AssertionError(f"no end after {MAX_STEPS} tokens")


def check_schema(value: Any, schema: dict[str, Any]) -> None:
    _check(value, schema, "$")
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(value, schema)


def _check(value: Any, schema: dict[str, Any], where: str) -> None:
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                _check(value, option, where)
                return
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{where}: matches no anyOf option: {errors}")
    if "const" in schema:
        assert value == schema["const"], f"{where}: {value!r} != const {schema['const']!r}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    kind = schema.get("type")
    if kind is not None:
        assert _is_type(value, kind), f"{where}: {value!r} is not {kind}"
    if isinstance(value, dict):
        _check_object(value, schema, where)
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, schema.get("items", {}), f"{where}[{i}]")
        assert len(value) >= schema.get("minItems", 0), f"{where}: too few items"
    if isinstance(value, str):
        assert len(value) <= schema.get("maxLength", len(value)), f"{where}: too long"
        if "pattern" in schema:
            assert re.search(schema["pattern"], value), f"{where}: {value!r} !~ {schema['pattern']}"
    if _is_type(value, "number"):
        assert value >= schema.get("minimum", value), f"{where}: {value} < minimum"
        assert value <= schema.get("maximum", value), f"{where}: {value} > maximum"


def _check_object(value: dict[str, Any], schema: dict[str, Any], where: str) -> None:
    properties = schema.get("properties", {})
    for name in schema.get("required", ()):
        assert name in value, f"{where}: missing {name!r}"
    for name, item in value.items():
        if name in properties:
            _check(item, properties[name], f"{where}.{name}")
        else:
            assert schema.get("additionalProperties", True) is not False, f"{where}: extra {name!r}"


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    types = {"string": str, "object": dict, "array": list, "boolean": bool, "null": type(None)}
    return isinstance(value, types[kind])
