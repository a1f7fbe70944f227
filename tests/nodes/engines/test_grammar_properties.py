"""Whatever a client sends as a grammar, compiling it is a success or a clean ValueError, and a
compiled one gives a mask (never a crash, never a hang): arbitrary text, and random schema-shaped
JSON built from the keywords JSON Schema has."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nodes.engines.grammar import GrammarCompiler
from nodes.engines.grammar_check import check_grammar
from nodes.engines.grammar_spec import GRAMMAR_KINDS, GrammarSpec
from nodes.engines.tiny import tiny_tokenizer

KEYWORDS = ["type", "properties", "items", "required", "enum", "const", "anyOf", "oneOf", "allOf", "not",
            "$ref", "$defs", "definitions", "pattern", "format", "minimum", "maximum", "minLength",
            "maxLength", "minItems", "maxItems", "additionalProperties", "prefixItems", "x-guidance",
            "exclusiveMinimum", "multipleOf", "uniqueItems", "if", "then", "else", "patternProperties"]
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "nope"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                    st.sampled_from(TYPES), st.text(max_size=8), st.sampled_from(["#", "#/$defs/a", "^a+$", "("]))
schema_like = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(KEYWORDS), st.text(max_size=4)), inner,
                                            max_size=5)),
    max_leaves=30)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(512)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, 512, cache_size=8)


def _compiles_or_value_error(compiler: GrammarCompiler, spec: GrammarSpec) -> None:
    try:
        state = compiler.new_state(spec)
    except ValueError as exc:
        assert str(exc)
        return
    state.allowed_mask()  # a compiled grammar also computes its first mask


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300), kind=st.sampled_from([*GRAMMAR_KINDS, "other"]))
def test_arbitrary_text_compiles_or_is_a_value_error(compiler, text, kind):
    _compiles_or_value_error(compiler, GrammarSpec(kind, text))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=st.dictionaries(st.sampled_from(KEYWORDS), schema_like, max_size=6))
def test_random_schemas_compile_or_are_value_errors(compiler, schema):
    _compiles_or_value_error(compiler, GrammarSpec("json_schema", json.dumps(schema)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=st.dictionaries(st.sampled_from(KEYWORDS), schema_like, max_size=6))
def test_the_gateways_check_agrees_with_the_engines_compile(compiler, schema):
    """What check_grammar (no tokenizer, no torch: the gateway) accepts, the engine compiles."""
    spec = GrammarSpec("json_schema", json.dumps(schema))
    try:
        check_grammar(spec)
    except ValueError:
        with pytest.raises(ValueError):
            compiler.compile(spec)
        return
    compiler.new_state(spec).allowed_mask()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.lists(st.text(max_size=12), min_size=1, max_size=6))
def test_any_choice_list_compiles_and_accepts_each_option(compiler, tokenizer, options):
    # Text spelling a special token ("<|im_end|>") encodes to that token, which is never text.
    assume(not any(token < 3 for option in options for token in tokenizer.encode(option)))
    spec = GrammarSpec.choice(options)
    for option in options:
        state = compiler.new_state(spec, replay=tokenizer.encode(option))
        assert state.is_accepting()
