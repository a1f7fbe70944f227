"""nodes/engines/grammar.py on the tiny tokenizer: masked random sampling always gives output the
grammar describes; EOS, padded vocabulary rows, replay, the cache, and clean errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

from nodes.engines.grammar import GrammarCompiler, GrammarState, apply_masks
from nodes.engines.grammar_bitmask import allocate_bitmask
from nodes.engines.grammar_check import check_grammar
from nodes.engines.grammar_spec import GrammarSpec
from nodes.engines.tiny import EOS_TOKEN_ID, tiny_tokenizer
from tests.nodes.engines.grammar_helpers import check_schema, closing_tokens, sample_output

PADDED_VOCAB = 512 + 64  # the logits are wider than the tokenizer, as in padded models
NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 12},
        "status": {"enum": ["active", "suspended"]},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["id", "name", "status", "address", "tags", "ok"],
    "additionalProperties": False,
}
TOOL_SCHEMA = {"anyOf": [
    {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}},
     "required": ["name", "arguments"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"const": "search"}, "arguments": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
     "required": ["name", "arguments"], "additionalProperties": False},
]}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(512)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, PADDED_VOCAB)


@pytest.fixture(scope="module")
def bonus(tokenizer):
    return closing_tokens(tokenizer, PADDED_VOCAB)


@pytest.mark.parametrize("schema", [NESTED_SCHEMA, TOOL_SCHEMA], ids=["nested", "tool_call"])
def test_masked_sampling_follows_the_schema(compiler, tokenizer, bonus, schema):
    spec = GrammarSpec.json_schema(schema)
    for seed in range(12):
        text = tokenizer.decode(sample_output(compiler, spec, tokenizer, seed, bonus))
        check_schema(json.loads(text), schema)


def test_masked_sampling_json_object_regex_and_choice(compiler, tokenizer, bonus):
    for seed in range(12):
        text = tokenizer.decode(sample_output(compiler, GrammarSpec.json_object(), tokenizer, seed, bonus))
        assert isinstance(json.loads(text), dict)
        text = tokenizer.decode(sample_output(compiler, GrammarSpec.regex(r"[a-c]{2,4}-[0-9]+"), tokenizer, seed))
        assert re.fullmatch(r"[a-c]{2,4}-[0-9]+", text), text
        options = ["yes", "no", "a|b (c)*", "\\d+", "ünï"]
        text = tokenizer.decode(sample_output(compiler, GrammarSpec.choice(options), tokenizer, seed))
        assert text in options


def test_output_has_json_dumps_separators_and_no_other_whitespace(compiler, tokenizer, bonus):
    for seed in range(5):
        text = tokenizer.decode(sample_output(compiler, GrammarSpec.json_schema(NESTED_SCHEMA), tokenizer, seed, bonus))
        outside_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
        assert not re.search(r"\s", re.sub(r"([,:]) ", r"\1", outside_strings)), text
        assert not re.search(r"[,:](?! )", outside_strings), text


def test_only_eos_is_allowed_once_terminated(compiler, tokenizer):
    state = compiler.new_state(GrammarSpec.choice(["yes"]))
    assert not state.is_terminated()
    assert EOS_TOKEN_ID not in state.allowed_tokens()
    for token in tokenizer.encode("yes"):
        assert state.accept(token)
    assert state.is_terminated() and state.is_accepting()
    assert state.allowed_tokens() == [EOS_TOKEN_ID]
    assert state.accept(EOS_TOKEN_ID)
    assert state.is_terminated() and state.error == ""


def test_eos_is_allowed_where_the_output_may_end(compiler, tokenizer):
    state = compiler.new_state(GrammarSpec.json_schema({"type": "integer"}))
    assert EOS_TOKEN_ID not in state.allowed_tokens()
    assert state.accept(tokenizer.encode("4")[0])
    assert state.is_accepting() and not state.is_terminated()
    assert EOS_TOKEN_ID in state.allowed_tokens()
    assert len(state.allowed_tokens()) > 1  # more digits may follow


def test_special_and_padded_ids_are_never_allowed(compiler, tokenizer):
    state = compiler.new_state(GrammarSpec.json_schema({"type": "string"}))
    state.accept(tokenizer.encode('"')[0])
    allowed = set(state.allowed_tokens())
    assert len(allowed) > 100  # inside a string nearly everything may follow
    assert not allowed & {0, 1, 2}  # <|endoftext|>, <|im_start|>, <|im_end|>: special, not text
    assert not allowed & set(range(tokenizer.vocab_size, PADDED_VOCAB))
    logits = torch.zeros(1, PADDED_VOCAB)
    apply_masks(logits, [state])
    assert torch.isinf(logits[0, tokenizer.vocab_size:]).all()


def test_refused_tokens_leave_the_state_unchanged(compiler, tokenizer):
    state = compiler.new_state(GrammarSpec.json_object())
    before = state.allowed_mask()
    for token in (tokenizer.encode("a")[0], EOS_TOKEN_ID, -1, PADDED_VOCAB, 10**9):
        assert not state.accept(token)
    assert torch.equal(state.allowed_mask(), before) and state.num_accepted == 0 and state.error == ""
    assert state.accept(tokenizer.encode("{")[0])


def test_replay_gives_the_same_state(compiler, tokenizer, bonus):
    spec = GrammarSpec.json_schema(NESTED_SCHEMA)
    tokens = sample_output(compiler, spec, tokenizer, seed=3, bonus=bonus)
    original = compiler.new_state(spec)
    for cut in range(len(tokens) + 1):
        if cut % 7 == 0 or cut == len(tokens):
            replayed = compiler.new_state(spec, replay=tokens[:cut])
            assert replayed.num_accepted == cut
            assert torch.equal(replayed.allowed_mask(), original.allowed_mask()), cut
            assert replayed.is_terminated() == original.is_terminated()
        if cut < len(tokens):
            assert original.accept(tokens[cut])
    assert original.is_terminated()


def test_replay_of_tokens_outside_the_grammar_is_a_value_error(compiler, tokenizer):
    with pytest.raises(ValueError, match="position 1"):
        compiler.new_state(GrammarSpec.json_object(), replay=tokenizer.encode("{") + tokenizer.encode("x"))


def test_states_from_one_compiled_grammar_are_independent(compiler, tokenizer):
    spec = GrammarSpec.json_object()
    first, second = compiler.new_state(spec), compiler.new_state(spec)
    assert first.accept(tokenizer.encode("{")[0])
    assert torch.equal(second.allowed_mask(), compiler.new_state(spec).allowed_mask())
    assert not torch.equal(first.allowed_mask(), second.allowed_mask())


def test_cache_is_lru_and_bounded(tokenizer):
    compiler = GrammarCompiler(tokenizer, 512, cache_size=2)
    specs = [GrammarSpec.regex(f"a{{{n}}}") for n in range(1, 4)]
    first = compiler.compile(specs[0])
    assert compiler.compile(GrammarSpec("regex", "a{1}")) is first  # equal specs share an entry
    compiler.compile(specs[1])
    compiler.compile(specs[0])  # now the most recent
    compiler.compile(specs[2])  # evicts specs[1]
    assert compiler.num_cached == 2
    assert compiler.compile(specs[0]) is first


@pytest.mark.parametrize("spec", [
    GrammarSpec("json_schema", json.dumps({"not": {"type": "string"}})),
    GrammarSpec("json_schema", json.dumps({"type": "integer", "minimum": -1e30, "maximum": 1e30})),
    GrammarSpec("json_schema", json.dumps({"type": "string", "pattern": "("})),
    GrammarSpec("json_schema", json.dumps({"$ref": "#/$defs/missing"})),
    GrammarSpec("json_schema", '{"type": "array", "items": ' * 300 + "{}" + "}" * 300),
    GrammarSpec("regex", "(unclosed"),
    GrammarSpec("json_schema", "not json"),
    GrammarSpec("json_schema", "[1, 2]"),
    GrammarSpec("kind-less", ""),
    GrammarSpec("json_schema", " " * 70000),
], ids=["not", "huge-range", "bad-pattern", "bad-ref", "deep", "bad-regex", "not-json", "not-object",
        "bad-kind", "too-big"])
def test_compile_errors_are_value_errors(compiler, spec):
    with pytest.raises(ValueError) as caught:
        compiler.compile(spec)
    assert 0 < len(str(caught.value)) < 400
    assert "<state>" not in str(caught.value)  # no parser dump reaches a client


def test_client_x_guidance_options_are_ignored(compiler, tokenizer, bonus):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "x-guidance": {"whitespace_flexible": True, "item_separator": ";"}}
    text = tokenizer.decode(sample_output(compiler, GrammarSpec.json_schema(schema), tokenizer, 0, bonus))
    assert text.startswith('{"a": ')


def test_a_tokenizer_without_eos_is_refused():
    tokenizer = tiny_tokenizer(512)
    tokenizer.eos_token_ids = ()
    with pytest.raises(ValueError, match="EOS"):
        GrammarCompiler(tokenizer, 512)


def test_fill_bitmask_checks_its_target(compiler):
    state = compiler.new_state(GrammarSpec.json_object())
    with pytest.raises(ValueError):
        state.fill_bitmask(torch.zeros(1, 32, dtype=torch.int64), 0)
    with pytest.raises(ValueError):
        state.fill_bitmask(allocate_bitmask(1, 64), 0)  # too narrow for the vocabulary
    with pytest.raises(ValueError):
        apply_masks(torch.zeros(2, PADDED_VOCAB), [state])


def test_apply_masks_on_bfloat16_and_rows_without_state(compiler, tokenizer):
    states = [None, compiler.new_state(GrammarSpec.json_object()), None,
              compiler.new_state(GrammarSpec.choice(["no"]))]
    logits = torch.randn(4, PADDED_VOCAB).bfloat16()
    original = logits.clone()
    apply_masks(logits, states)
    assert torch.equal(logits[0], original[0]) and torch.equal(logits[2], original[2])
    for row in (1, 3):
        allowed = states[row].allowed_mask()
        assert torch.equal(logits[row][allowed], original[row][allowed])
        assert torch.isinf(logits[row][~allowed]).all()
    assert tokenizer.decode([int(logits[1].argmax())]) == "{"
    apply_masks(logits, [None] * 4)  # nothing to do


def test_library_panics_are_value_errors_at_compile(compiler):
    # llguidance 1.9.1 panics (a BaseException) cutting an error message inside a character.
    spec = GrammarSpec.json_schema({"required": "é" * 80})
    with pytest.raises(ValueError, match="failed on it"):
        check_grammar(spec)
    with pytest.raises(ValueError, match="panic") as caught:  # the matcher catches its own, as an error
        compiler.compile(spec)
    assert "backtrace" not in str(caught.value)


class PanicException(BaseException):
    """Named as pyo3's: how a Rust panic reaches Python."""


class PanickingMatcher:
    def is_stopped(self):
        return False

    def is_error(self):
        return False

    def try_consume_tokens(self, tokens):
        raise PanicException("boom")

    def unsafe_compute_mask_ptr(self, pointer, size):
        raise PanicException("boom")


@pytest.mark.parametrize("first", ["fill", "accept"])
def test_a_panic_mid_stream_ends_the_request_with_eos(first):
    state = GrammarState(PanickingMatcher(), 64, (2, 63))
    if first == "accept":
        assert not state.accept(5)
    else:
        state.allowed_mask()
    assert state.is_terminated() and "boom" in state.error
    assert state.allowed_tokens() == [2, 63]
    assert state.accept(2) and not state.accept(5)
    with pytest.raises(KeyboardInterrupt):  # other BaseExceptions pass through
        GrammarState(type("M", (PanickingMatcher,), {"try_consume_tokens": _interrupt})(), 64, (2,)).accept(5)


def _interrupt(self, tokens):
    raise KeyboardInterrupt
