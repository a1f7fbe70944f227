"""The in-process meeting point of the vLLM adapter and PdbusConnector (no vLLM needed)."""

from __future__ import annotations

import torch

from nodes.engines.vllm_mailbox import KvMailbox


def _kv(num_tokens):
    return torch.zeros(2, 2, 3, num_tokens, 8)


def test_an_offer_is_counted_then_taken_once():
    box = KvMailbox()
    box.offer("r#0", _kv(12))
    assert box.num_offered_tokens("r#0") == 12 and box.num_offered_tokens("other") == 0
    assert box.num_offered_tokens(None) == 0
    assert box.take_offer("r#0").shape[3] == 12 and box.take_offer("r#0") is None
    assert (box.stats.num_offered, box.stats.num_injected, box.stats.num_injected_tokens) == (1, 1, 12)


def test_a_failed_load_drops_the_offer_and_remembers_why():
    box = KvMailbox()
    box.offer("r#1", _kv(5))
    box.fail("r#1", "shape")
    assert box.num_offered_tokens("r#1") == 0 and box.failure("r#1") == "shape"
    assert box.stats.num_load_failures == 1
    box.offer("r#1", _kv(5))            # a new offer for the same key clears the old failure
    assert box.failure("r#1") is None


def test_withdraw_forgets_offers_and_captures_so_aborts_leak_nothing():
    box = KvMailbox()
    box.offer("a", _kv(3))
    box.capture("b", _kv(4))
    box.withdraw("a")
    box.withdraw("b")
    box.withdraw("never-seen")
    assert box.num_pending() == 0


def test_captures_are_handed_over_once():
    box = KvMailbox()
    box.capture("p#0", _kv(7))
    assert box.take_capture("p#0").shape[3] == 7 and box.take_capture("p#0") is None
    assert (box.stats.num_captured, box.stats.num_captured_tokens) == (1, 7)
