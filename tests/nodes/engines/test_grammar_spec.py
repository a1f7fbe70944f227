"""GrammarSpec: plain data, importable without torch or a grammar library, validated with messages
a client can act on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nodes.engines.grammar_check import check_grammar
from nodes.engines.grammar_spec import MAX_CHOICES, MAX_GRAMMAR_CHARS, GrammarSpec


def test_builders_give_valid_hashable_specs():
    specs = [GrammarSpec.json_object(), GrammarSpec.json_schema({"type": "object"}),
             GrammarSpec.json_schema('{"type": "string"}'), GrammarSpec.regex("[0-9]+"),
             GrammarSpec.choice(["a", "b"])]
    assert len(set(specs)) == len(specs)
    assert GrammarSpec.json_schema({"type": "object"}) == GrammarSpec("json_schema", '{"type": "object"}')
    for spec in specs:
        assert GrammarSpec.from_wire(spec.to_wire()) == spec


@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec("yaml", ""), "unsupported grammar kind"),
    (GrammarSpec("json_object", "{}"), "takes no source"),
    (GrammarSpec("json_schema", "{"), "not valid JSON"),
    (GrammarSpec("json_schema", "[" * 60000), "not valid JSON"),  # past Python's recursion limit
    (GrammarSpec("json_schema", "true"), "must be a JSON object"),
    (GrammarSpec("json_schema", json.dumps({"description": "x" * MAX_GRAMMAR_CHARS})), "at most 65536"),
    (GrammarSpec("regex", 5), "must be a string"),  # type: ignore[arg-type]
    (GrammarSpec("choice", "[]"), "list of 1 to"),
    (GrammarSpec("choice", '["a", 1]'), "list of 1 to"),
    (GrammarSpec("choice", json.dumps(["a"] * (MAX_CHOICES + 1))), "list of 1 to"),
    (GrammarSpec("choice", "nope"), "not valid JSON"),
])
def test_invalid_specs_raise_value_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        spec.validate()


@pytest.mark.parametrize("body", [None, [], {"kind": "regex"}, {"kind": "regex", "source": "a", "x": 1},
                                  {"kind": ["regex"], "source": "a"}, {"kind": "regex", "source": None}])
def test_from_wire_refuses_malformed_bodies(body):
    with pytest.raises(ValueError):
        GrammarSpec.from_wire(body)


@pytest.mark.parametrize(("module", "loaded"), [("grammar_spec", "[]"), ("grammar_check", "['llguidance']")])
def test_the_gateway_side_modules_do_not_load_torch(module, loaded):
    code = (f"import sys, nodes.engines.{module}; "
            "print(sorted(m for m in ('torch', 'llguidance', 'xgrammar', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == loaded


@pytest.mark.parametrize("spec", [
    GrammarSpec.json_object(), GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}),
    GrammarSpec.regex("[0-9]+"), GrammarSpec.choice(["a", "b"])])
def test_check_grammar_passes_good_specs(spec):
    check_grammar(spec)


@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec("json_schema", json.dumps({"not": {"type": "string"}})), "Unimplemented"),
    (GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": "("})), "unclosed group"),
    (GrammarSpec("json_schema", json.dumps({"$ref": "#/$defs/x"})), "does not exist"),
    (GrammarSpec("regex", "(a"), "unclosed group"),
    (GrammarSpec("json_schema", "[]"), "must be a JSON object"),
])
def test_check_grammar_refuses_what_the_library_cannot_compile(spec, message):
    with pytest.raises(ValueError, match=message):
        check_grammar(spec)
