"""Logits processing and log-probabilities (nodes/engines/logits_process.py): penalties and
logit_bias against a plain reference of vLLM's definitions, log-probabilities against torch's
log-softmax, and through the engine: prompt logprobs (whole and chunked prefill) equal to what a
teacher-forced pass gives, decode logprobs, penalties steering greedy decoding, resumes counting
the delivered tokens as output."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from nodes.engines.logits_process import RequestLogits, sampled_logprobs, token_logprobs
from nodes.engines.prefill_pass import ChunkedPrefill
from nodes.engines.sampling import sample
from tests.nodes.engines.engine_helpers import drain, make_engine, tokens_of

VOCAB = 32


def reference(logits: list[float], sampling: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    """vLLM's processing, one element at a time."""
    out = list(logits)
    for token, bias in sampling.logit_bias:
        out[token] += bias
    seen = set(prompt) | set(output)
    for token in seen:
        if sampling.repetition_penalty != 1.0:
            out[token] = out[token] / sampling.repetition_penalty if out[token] > 0 else out[token] * sampling.repetition_penalty
    for token in set(output):
        out[token] -= sampling.frequency_penalty * output.count(token) + sampling.presence_penalty
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), st.lists(st.integers(0, VOCAB - 1), max_size=12),
       st.floats(-2, 2), st.floats(-2, 2), st.floats(0.1, 3.0),
       st.lists(st.tuples(st.integers(0, VOCAB - 1), st.floats(-100, 100)), max_size=4, unique_by=lambda t: t[0]),
       st.integers(0, 2**31))
def test_processing_matches_the_reference(prompt, output, presence, frequency, repetition, bias, seed):
    sampling = SamplingParams(presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
                              logit_bias=tuple(bias))
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed))
    expected = reference(logits.tolist(), sampling, prompt, output)
    processor = RequestLogits(sampling, prompt + output[:len(output) // 2], num_output_tokens=len(output) // 2)
    for token in output[len(output) // 2:]:
        processor.accept(token)
    row = logits.clone()
    processor.apply(row)
    assert row.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-5)   # float32 against float64


def test_default_sampling_processes_nothing():
    assert RequestLogits.for_request(SamplingParams(), [1, 2, 3]) is None
    assert RequestLogits.for_request(SamplingParams(presence_penalty=0.5), [1]) is not None


@pytest.mark.parametrize("bad", [dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                                 dict(logit_bias=((1, 101.0),)), dict(logit_bias=((-1, 1.0),)), dict(logprobs=21),
                                 dict(prompt_logprobs=-1)])
def test_out_of_range_settings_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_greedy_rows_see_the_bias_and_others_keep_their_argmax():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    greedy = SamplingParams(temperature=0.0)
    biased = SamplingParams(temperature=0.0, logit_bias=((7, 100.0),))
    processors = [None, RequestLogits(biased, [1]), None]
    tokens = sample(logits, [greedy, biased, greedy], [None] * 3, processors)
    assert tokens == [int(logits[0].argmax()), 7, int(logits[2].argmax())]


def test_logprobs_are_the_log_softmax_and_the_top_tokens_in_order():
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    found = token_logprobs(logits, [0, 1], [3, 5], [0, 4])
    expected = torch.log_softmax(logits, dim=-1)
    assert found[0].logprob == pytest.approx(float(expected[0, 3])) and found[0].top == ()
    assert [t for t, _ in found[1].top] == expected[1].argsort(descending=True)[:4].tolist()
    assert math.fsum(math.exp(lp) for lp in expected[1].tolist()) == pytest.approx(1.0)
    mixed = sampled_logprobs(logits, [SamplingParams(), SamplingParams(logprobs=1)], [0, 1])
    assert mixed[0] is None and mixed[1].logprob == pytest.approx(float(expected[1, 1]))


def _logprob_of(engine, prefix: tuple[int, ...], token: int) -> float:
    sampling = SamplingParams(temperature=0.0, max_tokens=1, logprobs=0, logit_bias=((token, 100.0),))
    result = engine.prefill([PrefillRequest("one", prefix, sampling)])[0]
    assert result.first_token_id == token   # the bias forced it; the logprob is of the raw distribution
    return result.logprobs.logprob


def test_prompt_logprobs_equal_teacher_forcing_whole_and_chunked(tiny_model):
    engine = make_engine(tiny_model, prefix_cache_bytes=0)
    prompt = tuple(torch.randint(0, 200, (9,), generator=torch.Generator().manual_seed(3)).tolist())
    sampling = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=3)
    whole = engine.prefill([PrefillRequest("w", prompt, sampling), PrefillRequest("x", prompt[:4], SamplingParams())])
    assert whole[0].prompt_logprobs[0] is None and len(whole[0].prompt_logprobs) == len(prompt)
    assert whole[1].prompt_logprobs == ()
    expected = [_logprob_of(engine, prompt[:i], prompt[i]) for i in range(1, len(prompt))]
    assert [lp.logprob for lp in whole[0].prompt_logprobs[1:]] == pytest.approx(expected, abs=1e-5)
    assert all(len(lp.top) == 3 for lp in whole[0].prompt_logprobs[1:])
    chunked = ChunkedPrefill(engine.runner, engine.tokenizer, [PrefillRequest("c", prompt, sampling)], chunk_tokens=2,
                             max_model_len=engine.max_model_len, eos_token_ids=engine.eos_token_ids)
    results = []
    while not chunked.done:
        results.extend(chunked.step())
    assert [lp.logprob for lp in results[0].prompt_logprobs[1:]] == pytest.approx(expected, abs=1e-5)
    assert results[0].first_token_id == whole[0].first_token_id


def test_prompt_logprobs_bypass_the_prefix_cache(tiny_model):
    engine = make_engine(tiny_model)
    prompt = tuple(range(5, 5 + 40))
    engine.prefill([PrefillRequest("warm", prompt, SamplingParams(temperature=0.0))])
    again = engine.prefill([PrefillRequest("echo", prompt, SamplingParams(temperature=0.0, prompt_logprobs=0))])[0]
    assert again.num_cached_tokens == 0 and len(again.prompt_logprobs) == len(prompt)


def test_decode_logprobs_match_a_prefill_of_the_same_context(tiny_model):
    engine = make_engine(tiny_model)
    prompt = (11, 12, 13, 14, 15)
    sampling = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    assert engine.add_request(DecodeRequest("d", prompt, sampling)).ok
    events = [e for e in drain(engine)["d"] if e.token_id is not None]
    context = prompt
    for event in events:
        assert event.logprobs is not None and len(event.logprobs.top) == 2
        assert event.logprobs.logprob == pytest.approx(_logprob_of(engine, context, event.token_id), abs=1e-5)
        assert event.logprobs.top[0][0] == event.token_id   # greedy: the likeliest token
        context += (event.token_id,)


def test_a_large_presence_penalty_stops_greedy_decoding_repeating(tiny_model):
    engine = make_engine(tiny_model)
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    penalised = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=2.0)
    for request_id, sampling in (("plain", plain), ("pen", penalised)):
        assert engine.add_request(DecodeRequest(request_id, (1, 2, 3), sampling)).ok
    events = drain(engine)
    assert len(set(tokens_of(events["plain"]))) < 24   # the random tiny model loops when greedy
    assert len(set(tokens_of(events["pen"]))) > len(set(tokens_of(events["plain"])))


def test_a_resume_counts_the_delivered_tokens_as_output(tiny_model):
    """A stream resumed after a failover decodes what the uninterrupted one would have."""
    engine = make_engine(tiny_model)
    sampling = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, frequency_penalty=1.5,
                              repetition_penalty=1.3)
    assert engine.add_request(DecodeRequest("full", (4, 5, 6), sampling)).ok
    full = tokens_of(drain(engine)["full"])
    delivered = tuple(full[:5])
    resumed = DecodeRequest("resume", (4, 5, 6) + delivered, SamplingParams(
        temperature=0.0, max_tokens=7, ignore_eos=True, frequency_penalty=1.5, repetition_penalty=1.3),
        num_output_tokens=5)
    assert engine.add_request(resumed).ok
    assert list(delivered) + tokens_of(drain(engine)["resume"]) == full
