"""Multi-turn: finished sessions keep their KV (LRU within budget) and later turns extend it."""

from __future__ import annotations

import torch

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from nodes.engines.prefill import PrefillBatcher
from tests.nodes.engines.engine_helpers import drain, make_engine, tokens_of

SAMPLING = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def encode(model, text):
    return tuple(model.tokenizer.encode(text))


def turn(engine, rid, prompt, session_id="s", sampling=SAMPLING):
    assert engine.add_request(DecodeRequest(rid, tuple(prompt), sampling, session_id=session_id)).ok
    return tokens_of(drain(engine)[rid])


def test_second_turn_reuses_kv_and_equals_a_fresh_prefill_of_the_conversation(tiny_model):
    engine = make_engine(tiny_model, prefill_chunk_tokens=4)
    first_prompt = encode(tiny_model, "Hello world! How are you today?")
    answer = turn(engine, "t1", first_prompt)
    cached = engine.cached_session_tokens("s")
    assert cached == len(first_prompt) + len(answer) - 1   # the last sampled token has no KV yet
    second_prompt = first_prompt + tuple(answer) + encode(tiny_model, " What is the capital of France?")
    seen = []
    engine.on_logits = lambda ids, logits: seen.extend(logits)
    prefilled_before = engine.stats.num_prefilled_tokens
    extended = turn(engine, "t2", second_prompt)
    assert engine.stats.num_reused_tokens == cached
    assert engine.stats.num_prefilled_tokens - prefilled_before == len(second_prompt) - cached
    fresh = make_engine(tiny_model)
    fresh_seen = []
    fresh.on_logits = lambda ids, logits: fresh_seen.extend(logits)
    assert extended == turn(fresh, "f", second_prompt, session_id=None)
    for a, b in zip(seen, fresh_seen, strict=True):
        assert (a - b).abs().max() < 1e-4


def test_divergent_history_reuses_only_the_common_prefix(tiny_model):
    engine = make_engine(tiny_model)
    prompt = encode(tiny_model, "The quick brown fox jumps over the lazy dog.")
    turn(engine, "t1", prompt)
    edited = prompt[:5] + encode(tiny_model, " cat sat")
    result = turn(engine, "t2", edited)
    assert engine.stats.num_reused_tokens == 5
    assert result == turn(make_engine(tiny_model), "f", edited, session_id=None)


def test_lru_session_is_evicted_first_when_space_is_needed(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=6, block_size=16, max_num_seqs=1)
    prompt = encode(tiny_model, "Good morning, good evening, good night.")
    for session in ("old", "new"):
        turn(engine, session, prompt, session_id=session)
    assert engine.kv_usage().num_sessions == 2
    big = DecodeRequest("big", prompt, SamplingParams(temperature=0, max_tokens=40), session_id=None)
    assert engine.add_request(big).ok
    assert engine.cached_session_tokens("old") == 0 and engine.cached_session_tokens("new") > 0
    drain(engine)


def test_sessions_are_dropped_rather_than_blocking_admission(tiny_model):
    engine = make_engine(tiny_model, num_kv_blocks=4, block_size=16, max_num_seqs=1)
    turn(engine, "t1", encode(tiny_model, "Hello world!"))
    assert engine.add_request(DecodeRequest("x", (5,) * 10, SamplingParams(max_tokens=50))).ok
    assert engine.kv_usage().num_sessions == 0


def test_aborted_requests_keep_no_session_and_drop_session_frees(tiny_model):
    engine = make_engine(tiny_model)
    prompt = encode(tiny_model, "Hello world!")
    engine.add_request(DecodeRequest("a", prompt, SAMPLING, session_id="s"))
    engine.step()
    engine.abort("a")
    assert engine.cached_session_tokens("s") == 0
    turn(engine, "b", prompt)
    assert engine.kv_usage().num_session_blocks > 0
    assert engine.drop_session("s") and not engine.drop_session("s")
    assert engine.kv_usage().num_free_blocks == engine.kv_usage().num_blocks


def test_imported_kv_supersedes_a_cached_session(tiny_model):
    engine = make_engine(tiny_model)
    prompt = encode(tiny_model, "Hello world! How are you today?")
    turn(engine, "t1", prompt)
    (result,) = engine.prefill([PrefillRequest("t2", prompt, SAMPLING)])
    engine.add_request(DecodeRequest("t2", prompt, SAMPLING, kv=result.kv, first_token_id=result.first_token_id,
                                     session_id="s"))
    drain(engine)
    assert engine.stats.num_reused_tokens == 0 and engine.kv_usage().num_sessions == 1
    assert torch.is_tensor(engine.sessions.get("s").payload)


def test_prefill_batcher_waits_for_tokens_or_time(clock):
    batcher = PrefillBatcher(max_batch_tokens=10, max_wait_s=0.05)
    batcher.add(PrefillRequest("a", (1,) * 4), clock())
    assert batcher.next_batch(clock()) == [] and batcher.deadline() == clock() + 0.05
    batcher.add(PrefillRequest("b", (1,) * 4), clock())
    batcher.add(PrefillRequest("c", (1,) * 4), clock())
    assert [r.request_id for r in batcher.next_batch(clock())] == ["a", "b"]   # budget reached
    assert batcher.next_batch(clock()) == []
    clock.advance(0.05)
    assert [r.request_id for r in batcher.next_batch(clock())] == ["c"]          # waited long enough
    batcher.add(PrefillRequest("d", (1,) * 30), clock())
    assert [r.request_id for r in batcher.next_batch(clock())] == ["d"]          # alone over budget
    batcher.add(PrefillRequest("e", (1,) * 3), clock())
    assert batcher.remove("e") and not batcher.remove("e") and len(batcher) == 0
