"""nodes/engines/grammar.py on SmolLM2-135M's real tokenizer (49,152 ids): masked random sampling
gives JSON that parses and fits the schema, replay reproduces the state, special tokens stay out.
Skipped where the packaged model is neither installed nor in the model cache."""

from __future__ import annotations

import json

import pytest
import torch

from nodes.engines.grammar import GrammarCompiler, apply_masks
from nodes.engines.grammar_spec import GrammarSpec
from nodes.engines.model_loader import ModelLoadError, open_model_folder
from tests.nodes.engines.grammar_helpers import check_schema, closing_tokens, sample_output
from tests.nodes.engines.test_grammar import NESTED_SCHEMA, TOOL_SCHEMA

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def model():
    try:
        return open_model_folder("SmolLM2-135M-Instruct")
    except ModelLoadError as exc:
        pytest.skip(f"SmolLM2-135M-Instruct is not available: {exc}")


@pytest.fixture(scope="module")
def compiler(model):
    return GrammarCompiler(model.tokenizer, model.config.vocab_size)


@pytest.fixture(scope="module")
def bonus(model):
    return closing_tokens(model.tokenizer, model.config.vocab_size)


def test_the_stop_token_is_the_models_eos(model, compiler):
    assert compiler.eos_token_ids == model.tokenizer.eos_token_ids == model.config.eos_token_ids
    state = compiler.new_state(GrammarSpec.choice(["Paris"]))
    for token in model.tokenizer.encode("Paris"):
        assert state.accept(token)
    assert state.is_terminated()
    assert state.allowed_tokens() == list(model.tokenizer.eos_token_ids)


@pytest.mark.parametrize("schema", [NESTED_SCHEMA, TOOL_SCHEMA], ids=["nested", "tool_call"])
def test_masked_sampling_follows_the_schema(model, compiler, bonus, schema):
    spec = GrammarSpec.json_schema(schema)
    for seed in range(4):
        text = model.tokenizer.decode(sample_output(compiler, spec, model.tokenizer, seed, bonus))
        check_schema(json.loads(text), schema)


def test_masked_sampling_json_object(model, compiler, bonus):
    for seed in range(4):
        tokens = sample_output(compiler, GrammarSpec.json_object(), model.tokenizer, seed, bonus)
        assert isinstance(json.loads(model.tokenizer.decode(tokens)), dict)


def test_special_tokens_are_never_allowed_inside_strings(model, compiler):
    state = compiler.new_state(GrammarSpec.json_schema({"type": "string"}))
    assert state.accept(model.tokenizer.encode('"')[0])
    allowed = state.allowed_mask()
    assert allowed.sum() > 40000
    specials = [i for i, t in model.tokenizer.backend.get_added_tokens_decoder().items() if t.special]
    assert specials and not allowed[specials].any()


def test_replay_of_a_real_output_gives_the_same_masks(model, compiler, bonus):
    spec = GrammarSpec.json_schema(TOOL_SCHEMA)
    tokens = sample_output(compiler, spec, model.tokenizer, seed=1, bonus=bonus)
    original = compiler.new_state(spec)
    for cut, token in enumerate(tokens):
        if cut % 5 == 0:
            replayed = compiler.new_state(spec, replay=tokens[:cut])
            assert torch.equal(replayed.allowed_mask(), original.allowed_mask()), cut
        assert original.accept(token)


def test_a_model_written_tool_call_is_accepted(model, compiler):
    text = json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})
    state = compiler.new_state(GrammarSpec.json_schema(TOOL_SCHEMA), replay=model.tokenizer.encode(text))
    assert state.is_terminated()
    logits = torch.randn(3, model.config.vocab_size)
    apply_masks(logits, [state, None, None])
    assert int(logits[0].argmax()) in model.tokenizer.eos_token_ids
