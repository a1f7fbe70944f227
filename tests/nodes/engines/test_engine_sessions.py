"""Multi-turn: finished sessions keep their KV (LRU within budget) and later turns extend it; each
engine test runs twice: sessions as tensors of their own, and in the tail of a reserved store."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from tests.nodes.engines.engine_helpers import drain, make_engine, tokens_of

SAMPLING = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(params=[False, True], ids=["on-demand", "reserved"])
def reserved(request):
    return request.param


def new_engine(model, reserved, **settings):
    engine = make_engine(model, **settings)
    if reserved:
        engine.reserve_kv_memory()
    return engine


def encode(model, text):
    return tuple(model.tokenizer.encode(text))


def turn(engine, rid, prompt, session_id="s", sampling=SAMPLING):
    assert engine.add_request(DecodeRequest(rid, tuple(prompt), sampling, session_id=session_id)).ok
    return tokens_of(drain(engine)[rid])


def test_second_turn_reuses_kv_and_equals_a_fresh_prefill_of_the_conversation(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved, prefill_chunk_tokens=4)
    first_prompt = encode(tiny_model, "Hello world! How are you today?")
    answer = turn(engine, "t1", first_prompt)
    cached = engine.cached_session_tokens("s")
    payload = engine.sessions.get("s").payload
    in_store = payload.untyped_storage().data_ptr() == engine.slots._store.untyped_storage().data_ptr()
    assert in_store == reserved                     # kept in the reserved store's tail: no new memory
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


def test_divergent_history_reuses_only_the_common_prefix(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved)
    prompt = encode(tiny_model, "The quick brown fox jumps over the lazy dog.")
    turn(engine, "t1", prompt)
    edited = prompt[:5] + encode(tiny_model, " cat sat")
    result = turn(engine, "t2", edited)
    assert engine.stats.num_reused_tokens == 5
    assert result == turn(make_engine(tiny_model), "f", edited, session_id=None)


def test_lru_session_is_evicted_first_when_space_is_needed(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved, num_kv_blocks=6, block_size=16, max_num_seqs=1)
    prompt = encode(tiny_model, "Good morning, good evening, good night.")
    for session in ("old", "new"):
        turn(engine, session, prompt, session_id=session)
    assert engine.kv_usage().num_sessions == 2
    big = DecodeRequest("big", prompt, SamplingParams(temperature=0, max_tokens=40), session_id=None)
    assert engine.add_request(big).ok
    assert engine.cached_session_tokens("old") == 0 and engine.cached_session_tokens("new") > 0
    drain(engine)


def test_sessions_are_dropped_rather_than_blocking_admission(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved, num_kv_blocks=4, block_size=16, max_num_seqs=1)
    turn(engine, "t1", encode(tiny_model, "Hello world!"))
    assert engine.add_request(DecodeRequest("x", (5,) * 10, SamplingParams(max_tokens=50))).ok
    assert engine.kv_usage().num_sessions == 0


def test_aborted_requests_keep_no_session_and_drop_session_frees(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved)
    prompt = encode(tiny_model, "Hello world!")
    engine.add_request(DecodeRequest("a", prompt, SAMPLING, session_id="s"))
    engine.step()
    engine.abort("a")
    assert engine.cached_session_tokens("s") == 0
    turn(engine, "b", prompt)
    assert engine.kv_usage().num_session_blocks > 0
    assert engine.drop_session("s") and not engine.drop_session("s")
    assert engine.kv_usage().num_free_blocks == engine.kv_usage().num_blocks


def test_imported_kv_supersedes_a_cached_session(tiny_model, reserved):
    engine = new_engine(tiny_model, reserved)
    prompt = encode(tiny_model, "Hello world! How are you today?")
    turn(engine, "t1", prompt)
    (result,) = engine.prefill([PrefillRequest("t2", prompt, SAMPLING)])
    engine.add_request(DecodeRequest("t2", prompt, SAMPLING, kv=result.kv, first_token_id=result.first_token_id,
                                     session_id="s"))
    drain(engine)
    assert engine.stats.num_reused_tokens == 0 and engine.kv_usage().num_sessions == 1
    assert torch.is_tensor(engine.sessions.get("s").payload)


def conversation(engine, model) -> tuple[list[list[int]], int]:
    """Five chats taking turns, two requests at a time, in a budget they overflow (evictions,
    reuse, compaction of the store's tail): every answer, and the tokens reused."""
    histories = {f"c{i}": encode(model, f"Chat {i}: tell me about the number {i}.") for i in range(5)}
    sampling = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    answers = []
    for step in range(8):
        pair = [f"c{(2 * step) % 5}", f"c{(2 * step + 1) % 5}"]
        for session in pair:
            assert engine.add_request(DecodeRequest(f"{session}-{step}", histories[session], sampling,
                                                    session_id=session)).ok
        events = drain(engine)
        for session in pair:
            answer = tokens_of(events[f"{session}-{step}"])
            answers.append(answer)
            histories[session] = histories[session] + tuple(answer) + encode(model, " and then?")
    return answers, engine.stats.num_reused_tokens


def test_sessions_in_a_small_reserved_store_give_exactly_the_on_demand_tokens(tiny_model):
    settings = {"num_kv_blocks": 40, "block_size": 16, "max_num_seqs": 4}   # 640 tokens
    on_demand = conversation(make_engine(tiny_model, **settings), tiny_model)
    engine = new_engine(tiny_model, True, **settings)
    assert conversation(engine, tiny_model) == on_demand
    assert on_demand[1] > 0 and len(engine.sessions) > 0
