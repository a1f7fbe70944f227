"""Workload generation: deterministic per seed, lengths within their ranges, 80/20 mix, arrivals."""

import math
import statistics

import pytest

from harness.bench.serve.serve_workload import FIRST_ID, arrival_offsets, mixed_workload, random_workload


def test_random_workload_is_deterministic_per_seed_and_within_the_range_ratio():
    first = random_workload(50, 512, 64, 0.9, vocab_size=1000, seed=7)
    assert first == random_workload(50, 512, 64, 0.9, vocab_size=1000, seed=7)
    assert first != random_workload(50, 512, 64, 0.9, vocab_size=1000, seed=8)
    assert all(51 <= s.prompt_len <= 973 and 6 <= s.output_len <= 122 for s in first)
    assert all(FIRST_ID <= t < 1000 for s in first for t in s.prompt_token_ids)


def test_random_workload_with_ratio_zero_has_exact_lengths():
    specs = random_workload(5, 100, 10, 0.0, vocab_size=512, seed=0)
    assert {(s.prompt_len, s.output_len) for s in specs} == {(100, 10)}


def test_mixed_workload_is_80_percent_chats_and_20_percent_documents():
    specs = mixed_workload(50, seed=3, vocab_size=49152)
    chats = [s for s in specs if s.kind == "chat"]
    documents = [s for s in specs if s.kind == "document"]
    assert (len(chats), len(documents)) == (40, 10)
    assert all(64 <= s.prompt_len <= 192 and s.output_len == 128 for s in chats)
    assert all(1152 <= s.prompt_len <= 1920 and s.output_len == 64 for s in documents)
    assert specs == mixed_workload(50, seed=3, vocab_size=49152)
    assert [s.kind for s in specs] != sorted(s.kind for s in specs)   # shuffled, not grouped


def test_mixed_workload_scale_shortens_outputs_only():
    full, half = mixed_workload(10, 1, 512), mixed_workload(10, 1, 512, scale=0.5)
    assert [s.prompt_token_ids for s in full] == [s.prompt_token_ids for s in half]
    assert [s.output_len for s in half] == [s.output_len // 2 for s in full]


def test_poisson_arrivals_have_the_asked_mean_rate_and_are_seeded():
    offsets = arrival_offsets(4000, rate=2.0, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert statistics.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.1)    # exponential: stdev = mean
    assert offsets == arrival_offsets(4000, rate=2.0, seed=1)
    bursty = arrival_offsets(4000, rate=2.0, burstiness=0.25, seed=1)
    assert statistics.stdev(b - a for a, b in zip(bursty, bursty[1:], strict=False)) > 0.8


def test_infinite_rate_sends_everything_at_once_and_bad_inputs_are_refused():
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_offsets(3, 0)
    with pytest.raises(ValueError):
        random_workload(1, 10, 10, 1.0, 512, 0)
    with pytest.raises(ValueError):
        random_workload(1, 10, 10, 0.5, vocab_size=FIRST_ID, seed=0)


def test_shared_prefix_workload_opens_most_chats_with_the_same_system_prompts_at_every_seed():
    from harness.bench.serve.serve_workload import SYSTEM_PROMPT_LEN, shared_prefix_workload
    first, other = shared_prefix_workload(200, seed=1, vocab_size=49152), shared_prefix_workload(200, seed=2,
                                                                                                    vocab_size=49152)
    chats = [s for s in first if s.kind == "chat"]
    assert 0.8 < len(chats) / len(first) < 0.97
    openings = {s.prompt_token_ids[:SYSTEM_PROMPT_LEN] for s in chats}
    assert len(openings) <= 4 and openings == {s.prompt_token_ids[:SYSTEM_PROMPT_LEN] for s in other
                                                if s.kind == "chat"}
    assert all(SYSTEM_PROMPT_LEN + 16 <= s.prompt_len <= SYSTEM_PROMPT_LEN + 48 for s in chats)
    assert all(min(s.prompt_token_ids) >= FIRST_ID for s in first)


def test_multi_turn_conversations_grow_turn_by_turn_and_wait_for_each_other():
    from harness.bench.serve.serve_workload import CHAT_SYSTEM_LEN, TURNS, multi_turn_workload
    specs = multi_turn_workload(40, seed=3, vocab_size=49152)
    assert len(specs) == 40 and len({s.session_id for s in specs}) == 40 // TURNS
    for i, spec in enumerate(specs):
        turn = i % TURNS
        assert spec.after == (i - 1 if turn else -1)
        if turn:   # the previous prompt, the previous reply's length of tokens, then a new message
            previous = specs[i - 1]
            assert spec.session_id == previous.session_id
            assert spec.prompt_token_ids[:previous.prompt_len] == previous.prompt_token_ids
            assert spec.prompt_len >= previous.prompt_len + previous.output_len + 48
    openings = {s.prompt_token_ids[:CHAT_SYSTEM_LEN] for s in specs}
    assert len(openings) <= 4
    assert multi_turn_workload(40, seed=3, vocab_size=49152) == specs


def test_a_conversation_starts_at_the_rate_divided_by_its_turns():
    from harness.bench.serve.serve_runner import SweepConfig, requests_for
    config = SweepConfig(workload="multi-turn", num_prompts=40, rates=[2.0])
    specs, offsets = requests_for(config, 0)
    starts = [o for s, o in zip(specs, offsets, strict=True) if s.after < 0]
    assert all(o == 0.0 for s, o in zip(specs, offsets, strict=True) if s.after >= 0)
    assert len(starts) == 10 and 6 < starts[-1] < 40   # 9 gaps at 0.5 conversations/s: ~18 s
