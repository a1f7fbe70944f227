"""Structured output through the engine (tiny random model): whatever the weights, greedy and
random sampling under a grammar give text that matches it, ending with "stop" when the grammar
is complete (even with ignore_eos); the prefill pass's first token obeys it too; a resumed stream
(its delivered tokens at the prompt's end) continues exactly; a grammar that cannot compile is
`rejected` at admission."""

from __future__ import annotations

import json

import pytest

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from nodes.engines.grammar_spec import GrammarSpec
from tests.nodes.engines.engine_helpers import drain, make_engine, tokens_of

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "pick": {"enum": ["red", "green"]}},
          "required": ["ok", "pick"], "additionalProperties": False}


def run(engine, prompt, sampling, request_id="g", **options):
    assert engine.add_request(DecodeRequest(request_id, prompt, sampling, **options)).ok
    events = drain(engine)[request_id]
    return events, engine.tokenizer.decode(tokens_of(events))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_matches_the_schema_and_ends_with_stop(tiny_model, temperature):
    engine = make_engine(tiny_model)
    sampling = SamplingParams(temperature=temperature, seed=3, max_tokens=64, ignore_eos=True,
                              grammar=GrammarSpec.json_schema(SCHEMA))
    events, _ = run(engine, (5, 6, 7), sampling)
    text = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop"
    value = json.loads(text)
    assert set(value) == {"ok", "pick"} and isinstance(value["ok"], bool) and value["pick"] in ("red", "green")


def test_choice_and_regex_grammars(tiny_model):
    engine = make_engine(tiny_model)
    events, _ = run(engine, (9, 10), SamplingParams(temperature=0.0, max_tokens=16,
                                                   grammar=GrammarSpec.choice(["alpha", "beta"])))
    assert "".join(e.text for e in events) in ("alpha", "beta")
    events, _ = run(engine, (9, 11), SamplingParams(temperature=1.0, seed=1, max_tokens=16,
                                                   grammar=GrammarSpec.regex("[0-9]{3}-[a-z]{2}")), "r")
    text = "".join(e.text for e in events)
    assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and text[4:].isalpha()


def test_the_prefill_nodes_first_token_obeys_the_grammar_and_decode_continues_it(tiny_model):
    prefill, decode = make_engine(tiny_model), make_engine(tiny_model)
    sampling = SamplingParams(temperature=0.0, max_tokens=64, grammar=GrammarSpec.json_schema(SCHEMA))
    first = prefill.prefill([PrefillRequest("p", (5, 6, 7), sampling)])[0]
    assert first.text == "{"   # the only start a JSON object allows here
    whole, _ = run(make_engine(tiny_model), (5, 6, 7), sampling)
    split, _ = run(decode, (5, 6, 7), sampling, kv=first.kv, first_token_id=first.first_token_id)
    assert [first.first_token_id] + tokens_of(split) == tokens_of(whole)


def test_a_resume_replays_the_delivered_tokens_into_the_grammar(tiny_model):
    engine = make_engine(tiny_model)
    sampling = SamplingParams(temperature=0.0, max_tokens=64, grammar=GrammarSpec.json_schema(SCHEMA))
    full = tokens_of(run(engine, (5, 6, 7), sampling)[0])
    delivered = tuple(full[:4])
    resumed = tokens_of(run(engine, (5, 6, 7) + delivered, SamplingParams(
        temperature=0.0, max_tokens=60, grammar=sampling.grammar), "resume", num_output_tokens=4)[0])
    assert list(delivered) + resumed == full


def test_a_grammar_the_library_refuses_is_rejected_at_admission(tiny_model):
    engine = make_engine(tiny_model)
    bad = SamplingParams(grammar=GrammarSpec("regex", "(unclosed"))
    admission = engine.add_request(DecodeRequest("bad", (1, 2), bad))
    assert admission.status == "rejected" and "grammar" in admission.reason
    assert engine.num_running == 0
