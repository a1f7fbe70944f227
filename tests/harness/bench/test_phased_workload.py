"""The phased workload: three back-to-back phases with their mixes, rates giving equal prompt
tokens per second, Poisson arrivals inside each phase, every request tagged, seeded."""

from __future__ import annotations

import pytest

from harness.bench.serve.phased_workload import (
    PHASES,
    expected_requests,
    mean_prompt_tokens,
    phase_plan,
    phased_workload,
)
from harness.bench.serve.serve_runner import SweepConfig, requests_for, warmup_specs


def test_the_plan_is_three_equal_phases_chat_document_chat():
    plan = phase_plan(2.0, 60.0)
    assert [(p.name, p.start_s, p.end_s) for p in plan] == [("chat-1", 0, 60), ("document", 60, 120),
                                                             ("chat-2", 120, 180)]
    assert [p.document_share for p in plan] == [0.05, 0.65, 0.05] and all(p.duration_s == 60 for p in plan)


def test_the_document_phase_sends_the_chat_phases_prompt_tokens_per_second():
    chat, document, _ = phase_plan(2.0, 60.0)
    assert mean_prompt_tokens(0.05) == pytest.approx(198.4) and mean_prompt_tokens(0.65) == pytest.approx(1043.2)
    assert document.rate * mean_prompt_tokens(0.65) == pytest.approx(chat.rate * mean_prompt_tokens(0.05))
    assert document.rate == pytest.approx(0.38, abs=0.01)
    assert {p.rate for p in phase_plan(2.0, 60.0, same_rate=True)} == {2.0}
    assert expected_requests(phase_plan(2.0, 60.0)) == pytest.approx(2 * 120 + document.rate * 60)


@pytest.mark.parametrize(("rate", "duration"), [(0, 60), (1, 0), (-1, 10)])
def test_a_plan_needs_a_rate_and_a_duration(rate, duration):
    with pytest.raises(ValueError):
        phase_plan(rate, duration)


def test_each_phase_has_its_mix_its_span_and_its_tag():
    plan = phase_plan(4.0, 100.0, same_rate=True)
    specs, offsets = phased_workload(plan, seed=3, vocab_size=49152)
    assert len(specs) == len(offsets) and offsets == sorted(offsets)
    for phase in plan:
        mine = [(s, t) for s, t in zip(specs, offsets, strict=True) if s.phase == phase.name]
        assert all(phase.start_s <= t < phase.end_s for _, t in mine)
        assert len(mine) == pytest.approx(phase.rate * phase.duration_s, rel=0.25)   # Poisson: ~400 +- 20
        documents = sum(s.kind == "document" for s, _ in mine)
        assert documents == round(len(mine) * phase.document_share)
    chats = [s for s in specs if s.kind == "chat"]
    assert all(64 <= s.prompt_len <= 192 and s.output_len == 128 for s in chats)
    assert all(1152 <= s.prompt_len <= 1920 and s.output_len == 64 for s in specs if s.kind == "document")


def test_the_same_seed_gives_the_same_requests_at_the_same_times():
    plan = phase_plan(1.0, 30.0)
    first = phased_workload(plan, 5, 512, scale=0.5)
    assert first == phased_workload(plan, 5, 512, scale=0.5)
    assert first != phased_workload(plan, 6, 512, scale=0.5)
    assert {s.output_len for s in first[0]} <= {64, 32}


def test_bursty_arrivals_keep_the_mean_rate():
    plan = phase_plan(5.0, 200.0, same_rate=True)
    specs, _ = phased_workload(plan, 1, 512, burstiness=0.5)
    assert len(specs) == pytest.approx(3000, rel=0.15)
    with pytest.raises(ValueError):
        phased_workload(plan, 1, 512, burstiness=0)


def test_the_sweep_runs_the_phased_workload_at_each_rate():
    config = SweepConfig(workload="phased", rates=[1.0, 2.0], phase_duration_s=20.0, vocab_size=512, seed=4)
    slow, fast = requests_for(config, 0), requests_for(config, 1)
    assert {s.phase for s in slow[0]} == {name for name, _ in PHASES}
    assert len(fast[0]) > len(slow[0]) and max(fast[1]) < 60
    assert {s.kind for s in warmup_specs(config)} == {"chat", "document"}
