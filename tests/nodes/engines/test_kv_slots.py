"""The decode batch's slot cache (nodes/engines/kv_slots.py): growth within the budget, and the
tensor kept between requests: reused as it is when it holds what is asked, replaced (not grown,
nothing copied) when it does not or no longer fits the budget."""

from __future__ import annotations

import torch

from nodes.engines.kv_slots import SlotCache
from nodes.engines.model_config import LlamaConfig

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None, eos_token_ids=(0,))


def cache(budget_tokens: int = 8 * 1024) -> SlotCache:
    return SlotCache(CONFIG, dtype=torch.float32, device=torch.device("cpu"), max_slots=16, max_len=4096,
                     budget_tokens=budget_tokens)


def shape(slots: SlotCache) -> tuple[int, int]:
    return slots.tensor.shape[1], slots.tensor.shape[4]


def test_growth_keeps_what_the_slots_held():
    slots = cache()
    slots.ensure(1, 100)
    kv = torch.randn(2, 2, 2, 100, 8)
    slots.write(0, kv)
    slots.ensure(9, 300)
    assert (slots.num_slots, slots.capacity) == shape(slots) and slots.num_slots >= 9 and slots.capacity >= 300
    assert torch.equal(slots.read(0, 100), kv)


def test_an_idle_cache_is_kept_and_reused_as_it_is_for_a_request_it_holds():
    slots = cache()
    slots.ensure(3, 500)
    before, kept = slots.tensor.data_ptr(), shape(slots)
    slots.idle()
    assert slots.num_slots == 0 and slots.capacity == 0 and slots.num_bytes == slots.tensor.numel() * 4
    assert slots.layout_after(1, 400) == kept      # what admission charges: the kept tensor
    slots.ensure(1, 400)
    assert slots.tensor.data_ptr() == before and (slots.num_slots, slots.capacity) == kept


def test_an_idle_cache_too_small_for_the_next_request_is_replaced_by_a_fresh_layout():
    slots = cache()
    slots.ensure(8, 256)
    slots.idle()
    fresh = cache()
    fresh.ensure(1, 1024)
    assert slots.layout_after(1, 1024) == shape(fresh)   # not the old slot count carried over
    slots.ensure(1, 1024)
    assert shape(slots) == shape(fresh) and not slots.tensor.any()   # new, zeros: nothing copied


def test_an_idle_cache_beyond_a_smaller_budget_is_not_kept():
    slots = cache(budget_tokens=8 * 1024)
    slots.ensure(8, 1024)                          # 8 x 1024 tokens: the whole budget
    slots.idle()
    num_slots, capacity = slots.layout_after(1, 256, budget_tokens=2048)
    assert num_slots * capacity <= 2048
    slots.ensure(1, 256, budget_tokens=2048)       # cached sessions took the rest meanwhile
    assert shape(slots)[0] * shape(slots)[1] <= 2048


def test_release_frees_it():
    slots = cache()
    slots.ensure(1, 10)
    slots.release()
    assert slots.tensor is None and slots.num_bytes == 0


def test_an_idle_cache_with_longer_rows_than_a_fresh_one_is_not_kept():
    slots = cache()
    slots.ensure(1, 1000)                          # one long request: rows of 1024 tokens
    slots.idle()
    fresh = cache()
    fresh.ensure(1, 100)
    # kept, 1024-token rows would cap how many short requests could join later
    assert slots.layout_after(1, 100) == shape(fresh) != (slots.tensor.shape[1], slots.tensor.shape[4])
