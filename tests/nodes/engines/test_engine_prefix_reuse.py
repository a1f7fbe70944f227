"""Decode-side prefix reuse (prefix_leases.py): a prefix that requests shared is kept, held for a
request whose KV is on its way, and only the rest of the KV is imported; the output is the one a
full import gives, token for token, in fp32 and bf16, with raw or piecewise KV, after eviction
pressure and when the session that held it moved on."""

from __future__ import annotations

import pytest
import torch

from nodes.engines.base import DecodeRequest, PrefillRequest, SamplingParams
from tests.nodes.engines.engine_helpers import drain, make_engine, raw_pieces, tokens_of

SAMPLING = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SHARED = tuple(range(3, 3 + 40))          # a "system prompt" of 40 tokens: 2 full blocks of 16 reusable


def prompt_of(question: int) -> tuple[int, ...]:
    return SHARED + (question, question + 1, question + 2)


def prefilled(engine, prompt):
    [result] = engine.prefill([PrefillRequest("p", prompt, SAMPLING)])
    return result


def serve_full(engine, request_id, prompt, prefill_engine, **fields):
    """A remote request whose whole KV arrives (what a decode node without a kept prefix gets)."""
    result = prefilled(prefill_engine, prompt)
    request = DecodeRequest(request_id, prompt, SAMPLING, kv=result.kv, first_token_id=result.first_token_id,
                            **fields)
    assert engine.add_request(request).ok
    return [result.first_token_id, *tokens_of(drain(engine)[request_id])]


def serve_rest(engine, request_id, prompt, prefill_engine, salt="", pieces=False):
    """A remote request whose leading KV this engine holds: only the rest is imported."""
    held = engine.hold_prefix(request_id, prompt, salt)
    result = prefilled(prefill_engine, prompt)
    rest = result.kv[:, :, :, held:].contiguous()
    request = DecodeRequest(request_id, prompt, SAMPLING, kv=raw_pieces(rest, 4096) if pieces else rest,
                            first_token_id=result.first_token_id, cached_prefix_tokens=held, cache_salt=salt)
    assert engine.add_request(request).ok
    return held, [result.first_token_id, *tokens_of(drain(engine)[request_id])]


def warmed(tiny_model, **settings):
    """A decode engine that has served two requests sharing SHARED (so it keeps their prefix)."""
    engine, prefill = make_engine(tiny_model, **settings), make_engine(tiny_model, **settings)
    for i, question in enumerate((100, 110)):
        serve_full(engine, f"w{i}", prompt_of(question), prefill)
    return engine, prefill


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pieces", [False, True], ids=["tensor", "raw-pieces"])
def test_a_kept_prefix_and_the_rest_give_the_tokens_of_a_full_import(tiny_model, dtype, pieces):
    engine, prefill = warmed(tiny_model, dtype=dtype)
    assert engine.kv_usage().num_sessions == 1           # one kept prefix, no session
    held, tokens = serve_rest(engine, "r", prompt_of(120), prefill, pieces=pieces)
    assert held == 32 and engine.stats.num_prefix_reused_tokens == 32
    reference = serve_full(make_engine(tiny_model, dtype=dtype), "f", prompt_of(120), prefill)
    assert tokens == reference


def test_a_unique_prompt_is_not_kept_and_a_first_shared_one_only_once(tiny_model):
    engine, prefill = make_engine(tiny_model), make_engine(tiny_model)
    serve_full(engine, "a", prompt_of(100), prefill)
    assert engine.kv_usage().num_sessions == 0 and engine.hold_prefix("x", prompt_of(120), "") == 0
    for i in range(3):
        serve_full(engine, f"b{i}", prompt_of(110 + i), prefill)
    assert engine.kv_usage().num_sessions == 1
    assert engine.hold_prefix("x", prompt_of(120), "") == 32


def test_keep_prefixes_off_keeps_nothing(tiny_model):
    engine, _ = warmed(tiny_model, keep_prefixes=False)
    assert engine.kv_usage().num_sessions == 0 and engine.hold_prefix("x", prompt_of(120), "") == 0


def test_another_tenant_never_finds_the_prefix(tiny_model):
    engine, _ = warmed(tiny_model)
    assert engine.hold_prefix("x", prompt_of(120), "tenant-b") == 0
    assert engine.hold_prefix("y", prompt_of(120), "") == 32


def test_the_last_prompt_token_is_never_held(tiny_model):
    engine, _ = warmed(tiny_model)
    assert engine.hold_prefix("x", SHARED[:33], "") == 32
    assert engine.hold_prefix("y", SHARED[:32], "") == 16   # 32 tokens: the 32nd is computed where it runs
    assert engine.hold_prefix("z", SHARED[:16], "") == 0


def test_a_held_prefix_survives_eviction_pressure_and_is_released(tiny_model):
    engine, prefill = warmed(tiny_model, num_kv_blocks=12, block_size=16, max_num_seqs=2)
    assert engine.hold_prefix("r", prompt_of(120), "") == 32
    big = DecodeRequest("big", tuple(range(200, 290)), SamplingParams(temperature=0, max_tokens=80))  # 11 blocks
    assert not engine.add_request(big).ok                 # it would need the held prefix's blocks
    engine.release_prefix("r")
    assert engine.add_request(big).ok                     # released: evictable again
    assert engine.kv_usage().num_sessions == 0
    drain(engine)


def test_a_request_whose_prefix_is_not_held_is_rejected_clearly(tiny_model):
    engine, prefill = warmed(tiny_model)
    result = prefilled(prefill, prompt_of(120))
    request = DecodeRequest("r", prompt_of(120), SAMPLING, kv=result.kv[:, :, :, 32:].contiguous(),
                            first_token_id=result.first_token_id, cached_prefix_tokens=32)
    admission = engine.add_request(request)
    assert admission.status == "rejected" and "no cached prefix of 32 tokens" in admission.reason
    assert engine.hold_prefix("r", prompt_of(120), "") == 32 and engine.add_request(request).ok
    drain(engine)


def test_a_session_superseded_while_held_stays_as_a_prefix(tiny_model):
    engine, prefill = make_engine(tiny_model), make_engine(tiny_model)
    serve_full(engine, "t1", prompt_of(100), prefill, session_id="s")
    assert engine.hold_prefix("other", prompt_of(120), "") == 32     # held from the session's KV
    serve_full(engine, "t2", prompt_of(130), prefill, session_id="s")  # the session moves on
    held_entry = engine.prefixes.lease("other").entry
    assert held_entry.session_id.startswith("prefix:") and held_entry.session_id in engine.sessions
    result = prefilled(prefill, prompt_of(120))
    request = DecodeRequest("other", prompt_of(120), SAMPLING, kv=result.kv[:, :, :, 32:].contiguous(),
                            first_token_id=result.first_token_id, cached_prefix_tokens=32)
    assert engine.add_request(request).ok
    tokens = [result.first_token_id, *tokens_of(drain(engine)["other"])]
    assert tokens == serve_full(make_engine(tiny_model), "f", prompt_of(120), prefill)


def test_a_long_follow_up_turn_holds_its_own_session(tiny_model):
    engine, prefill = make_engine(tiny_model), make_engine(tiny_model)
    first = serve_full(engine, "t1", prompt_of(100), prefill, session_id="s")
    follow_up = prompt_of(100) + tuple(first) + tuple(range(150, 190))
    held = engine.hold_prefix("t2", follow_up, "")
    assert held == 48 and engine.prefixes.lease("t2").entry.session_id == "s"
    result = prefilled(prefill, follow_up)
    request = DecodeRequest("t2", follow_up, SAMPLING, kv=result.kv[:, :, :, held:].contiguous(),
                            first_token_id=result.first_token_id, session_id="s", cached_prefix_tokens=held)
    assert engine.add_request(request).ok
    assert "s" not in engine.sessions                     # taken by its own follow-up, as a cached turn is
    drain(engine)
    assert engine.cached_session_tokens("s") > len(follow_up)


def test_a_short_rest_is_prefilled_on_top_of_the_held_prefix(tiny_model):
    engine, prefill = warmed(tiny_model)
    prompt = prompt_of(120)
    held = engine.hold_prefix("r", prompt, "")
    assert engine.add_request(DecodeRequest("r", prompt, SAMPLING, cached_prefix_tokens=held)).ok
    prefilled_before = engine.stats.num_prefilled_tokens
    tokens = tokens_of(drain(engine)["r"])
    assert engine.stats.num_prefilled_tokens - prefilled_before == len(prompt) - held
    local = make_engine(tiny_model)
    assert local.add_request(DecodeRequest("f", prompt, SAMPLING)).ok
    assert tokens == tokens_of(drain(local)["f"])


def test_a_decode_request_with_more_kv_than_prompt_is_refused():
    with pytest.raises(ValueError, match="cached"):
        DecodeRequest("r", (1, 2, 3), SAMPLING, kv=torch.zeros(1, 2, 1, 2, 4), cached_prefix_tokens=2)
    with pytest.raises(ValueError):
        DecodeRequest("r", (1, 2, 3), SAMPLING, cached_prefix_tokens=-1)
