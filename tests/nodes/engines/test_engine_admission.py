"""Admission control, abort, finish reasons, seeds and stops through the engine (tiny model)."""

from __future__ import annotations

import dataclasses

import torch

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from tests.nodes.engines.engine_helpers import drain, generate, make_engine, tokens_of

PROMPT = "Hello world! How are you today?"


def request(model, rid, max_tokens=8, text=PROMPT, **params):
    params.setdefault("temperature", 0.0)
    params.setdefault("ignore_eos", True)
    return DecodeRequest(rid, tuple(model.tokenizer.encode(text)), SamplingParams(max_tokens=max_tokens, **params))


def test_blocks_are_reserved_for_prompt_plus_max_tokens(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=64, block_size=4)
    req = request(tiny_model, "a", max_tokens=7)
    admission = engine.add_request(req)
    assert admission.ok and admission.num_blocks_needed == -(-(len(req.prompt_token_ids) + 7) // 4)
    assert engine.kv_usage().num_running_blocks == admission.num_blocks_needed
    drain(engine)
    assert engine.kv_usage().num_free_blocks == 64


def test_full_budget_answers_full_then_admits_after_a_finish(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=8, block_size=16)
    assert engine.add_request(request(tiny_model, "a", max_tokens=100)).ok
    refused = engine.add_request(request(tiny_model, "b", max_tokens=100))
    assert refused.status == "full" and "KV budget full" in refused.reason
    assert engine.check_admission(request(tiny_model, "b", max_tokens=100)).status == "full"
    drain(engine)
    assert engine.add_request(request(tiny_model, "b", max_tokens=100)).ok


def test_max_num_seqs_answers_full(tiny_model):
    engine = make_engine(tiny_model, max_num_seqs=2)
    assert engine.add_request(request(tiny_model, "a")).ok and engine.add_request(request(tiny_model, "b")).ok
    answer = engine.add_request(request(tiny_model, "c"))
    assert answer.status == "full" and "max_num_seqs" in answer.reason


def test_impossible_requests_are_rejected_with_a_reason(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=3, block_size=16, max_model_len=64)
    assert engine.add_request(request(tiny_model, "big", max_tokens=60)).status == "rejected"
    too_long = DecodeRequest("long", tuple([5] * 64), SamplingParams())
    assert "no room" in engine.add_request(too_long).reason
    bad_token = DecodeRequest("tok", (5, 10_000), SamplingParams())
    assert "vocabulary" in engine.add_request(bad_token).reason
    bad_kv = DecodeRequest("kv", (5, 6), SamplingParams(), kv=torch.zeros(1, 2, 2, 2, 16))
    assert "KV shape" in engine.add_request(bad_kv).reason
    assert not engine.has_unfinished() and engine.kv_usage().num_free_blocks == 3


def test_duplicate_request_id_is_rejected_and_the_first_keeps_running(tiny_model):
    engine = make_engine(tiny_model)
    assert engine.add_request(request(tiny_model, "a")).ok
    assert engine.add_request(request(tiny_model, "a")).status == "rejected"
    assert len(drain(engine)["a"]) == 8


def test_abort_frees_blocks_and_is_idempotent(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=32)
    engine.add_request(request(tiny_model, "a", max_tokens=50))
    engine.add_request(request(tiny_model, "b", max_tokens=5))
    engine.step()
    event = engine.abort("a")
    assert event.finish_reason == "abort" and event.token_id is None
    assert engine.abort("a") is None
    events = drain(engine)
    assert "a" not in events and len(events["b"]) == 4
    assert engine.kv_usage().num_free_blocks == 32


def test_abort_during_chunked_prefill(tiny_model):
    engine = make_engine(tiny_model, prefill_chunk_tokens=2)
    engine.add_request(request(tiny_model, "a"))
    engine.step()
    assert engine.abort("a").finish_reason == "abort"
    assert not engine.has_unfinished() and engine.kv_usage().num_running_blocks == 0


def test_eos_stops_unless_ignored(tiny_model):
    prompt = tuple(tiny_model.tokenizer.encode(PROMPT))
    (result,) = make_engine(tiny_model).prefill([PrefillRequest("p", prompt, SamplingParams(temperature=0))])
    # Declare the greedy first token to be the model's EOS.
    eos_model = dataclasses.replace(tiny_model, config=dataclasses.replace(
        tiny_model.config, eos_token_ids=(result.first_token_id,)))
    (event,) = drain_after(make_engine(eos_model), DecodeRequest("s", prompt, SamplingParams(temperature=0)))["s"]
    assert (event.token_id, event.finish_reason, event.text) == (result.first_token_id, "stop", "")
    ignored = SamplingParams(temperature=0, ignore_eos=True, max_tokens=3)
    events = drain_after(make_engine(eos_model), DecodeRequest("i", prompt, ignored))["i"]
    assert [e.finish_reason for e in events] == [None, None, "length"]


def test_stop_string_through_the_engine(tiny_model):
    engine = make_engine(tiny_model)
    free = tokens_of(drain_after(engine, request(tiny_model, "a", max_tokens=12))["a"])
    text = tiny_model.tokenizer.decode(free)
    stop = text[3:6]
    assert stop
    events = drain_after(make_engine(tiny_model), request(tiny_model, "b", max_tokens=12, stop=(stop,)))["b"]
    assert events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events) == text[:text.find(stop)]


def drain_after(engine, req):
    assert engine.add_request(req).ok
    return drain(engine)


def test_seeded_sampling_is_reproducible_and_survives_disaggregation(tiny_model):
    sampling = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=1234, max_tokens=12, ignore_eos=True)
    prompt = tuple(tiny_model.tokenizer.encode(PROMPT))
    first = generate(make_engine(tiny_model), prompt, sampling)
    assert generate(make_engine(tiny_model), prompt, sampling) == first
    prefill_side, decode_side = make_engine(tiny_model), make_engine(tiny_model)
    (result,) = prefill_side.prefill([PrefillRequest("r", prompt, sampling)])
    decode_side.add_request(DecodeRequest("r", prompt, sampling, kv=result.kv, first_token_id=result.first_token_id))
    assert [result.first_token_id] + tokens_of(drain(decode_side)["r"]) == first
    other = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=99, max_tokens=12, ignore_eos=True)
    assert generate(make_engine(tiny_model), prompt, other) != first


def test_first_token_that_already_finished_closes_the_stream(tiny_model):
    engine = make_engine(tiny_model)
    prompt = tuple(tiny_model.tokenizer.encode(PROMPT))
    sampling = SamplingParams(temperature=0, max_tokens=1)
    (result,) = engine.prefill([PrefillRequest("r", prompt, sampling)])
    assert result.finish_reason == "length"
    engine.add_request(DecodeRequest("r", prompt, sampling, kv=result.kv, first_token_id=result.first_token_id))
    (event,) = drain(engine)["r"]
    assert event.finish_reason == "length" and event.token_id is None
    assert engine.kv_usage().num_running_blocks == 0


def test_context_end_finishes_with_length(tiny_model):
    engine = make_engine(tiny_model, max_model_len=24)
    prompt = tuple(tiny_model.tokenizer.encode(PROMPT))
    events = drain_after(engine, DecodeRequest("r", prompt, SamplingParams(temperature=0, max_tokens=100,
                                                                         ignore_eos=True)))["r"]
    assert len(prompt) + len(events) == 24 and events[-1].finish_reason == "length"
