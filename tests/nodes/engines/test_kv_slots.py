"""The decode batch's slot cache (nodes/engines/kv_slots.py): growth within the budget keeps what
the slots hold (in place within a reserved store, by copying into a new one otherwise); an idle
cache lays a fresh layout over its store; a trimmed store gives pages back and keeps its layout."""

from __future__ import annotations

import math

import pytest
import torch

from nodes.engines.kv_slots import SlotCache, relayout
from nodes.engines.model_config import LlamaConfig
from tests.nodes.engines.engine_helpers import raw_pieces

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=None, eos_token_ids=(0,))
TOKEN_ELEMENTS = 2 * 2 * 2 * 8     # layers x {K,V} x kv_heads x head_dim


def cache(budget_tokens: int = 8 * 1024, config: LlamaConfig = CONFIG) -> SlotCache:
    return SlotCache(config, dtype=torch.float32, device=torch.device("cpu"), max_slots=16, max_len=4096,
                     budget_tokens=budget_tokens)


def shape(slots: SlotCache) -> tuple[int, int]:
    return slots.tensor.shape[1], slots.tensor.shape[4]


def fill(slots: SlotCache, num_tokens: int) -> list[torch.Tensor]:
    kvs = [torch.randn(2, 2, 2, num_tokens, 8) for _ in range(slots.num_slots)]
    for slot, kv in enumerate(kvs):
        slots.write(slot, kv)
    return kvs


def test_growth_keeps_what_the_slots_held():
    slots = cache()
    slots.ensure(1, 100)
    kv = torch.randn(2, 2, 2, 100, 8)
    slots.write(0, kv)
    slots.ensure(9, 300)
    assert (slots.num_slots, slots.capacity) == shape(slots) and slots.num_slots >= 9 and slots.capacity >= 300
    assert torch.equal(slots.read(0, 100), kv)


def test_within_a_reserved_store_growth_moves_rows_in_place_and_keeps_them():
    slots = cache()
    slots.reserve(8 * 1024)
    store = slots._store.data_ptr()
    slots.ensure(8, 200)
    kvs = fill(slots, 200)
    slots.ensure(9, 900)                            # more slots and longer rows at once
    assert shape(slots)[0] >= 9 and shape(slots)[1] >= 900
    assert slots.tensor.data_ptr() == store        # nothing allocated
    assert all(torch.equal(slots.read(i, 200), kv) for i, kv in enumerate(kvs))


@pytest.mark.parametrize(("old", "new"), [
    ((3, 8, 2, 2, 256, 8), (3, 16, 2, 2, 256, 8)),     # slots only: layer 0 stays put
    ((3, 8, 2, 2, 256, 8), (3, 8, 2, 2, 512, 8)),      # capacity only: every row moves
    ((5, 64, 2, 1, 16, 4), (5, 72, 2, 1, 16, 4)),      # destinations overlapping their own sources
    ((4, 3, 2, 2, 5, 2), (4, 11, 2, 2, 13, 2)),        # both, odd sizes
])
@pytest.mark.parametrize("num_live", [None, 1, 3])
def test_relayout_equals_copying_into_a_new_layout(old, new, num_live):
    store = torch.randn(math.prod(new) + 7)
    before = store[:math.prod(old)].view(old).clone()
    relayout(store, old, new, num_live)
    moved = store[:math.prod(new)].view(new)
    n = old[4] if num_live is None else num_live   # only the live prefix of each row need move
    assert torch.equal(moved[:, :old[1], :, :, :n], before[:, :, :, :, :n])


def test_an_idle_cache_lays_a_fresh_layout_over_its_store():
    slots = cache()
    slots.ensure(3, 500)
    before = slots.tensor.data_ptr()
    slots.idle()
    assert slots.num_slots == 0 and slots.capacity == 0 and slots.num_bytes == slots.tensor.numel() * 4
    fresh = cache()
    fresh.ensure(1, 100)
    assert slots.layout_after(1, 100) == shape(fresh)   # what admission charges: a fresh layout
    slots.ensure(1, 100)
    assert slots.tensor.data_ptr() == before and shape(slots) == shape(fresh)


def test_an_idle_cache_too_small_for_the_next_request_gets_a_new_zeroed_store():
    slots = cache()
    slots.ensure(8, 256)
    fill(slots, 256)
    slots.idle()
    fresh = cache()
    fresh.ensure(1, 1024)
    assert slots.layout_after(1, 1024) == shape(fresh)   # not the old slot count carried over
    slots.ensure(1, 1024)
    assert shape(slots) == shape(fresh) and not slots.tensor.any()   # new, zeros: nothing copied


def test_layouts_stay_within_a_smaller_budget():
    slots = cache(budget_tokens=8 * 1024)
    slots.reserve(8 * 1024)
    slots.ensure(8, 1024)                          # 8 x 1024 tokens: the whole budget
    slots.idle()
    num_slots, capacity = slots.layout_after(1, 256, budget_tokens=2048)
    assert num_slots * capacity <= 2048
    slots.ensure(1, 256, budget_tokens=2048)       # cached sessions took the rest meanwhile
    assert shape(slots)[0] * shape(slots)[1] <= 2048


def test_reserve_allocates_the_rows_asked_once():
    slots = cache()
    slots.reserve(4096)
    assert slots.num_store_tokens == 4096 and slots.num_bytes == 4096 * TOKEN_ELEMENTS * 4
    before = slots._store.data_ptr()
    slots.reserve(1024)                            # holds them already
    assert slots._store.data_ptr() == before and slots.num_slots == 0


def test_reserve_while_running_keeps_the_running_slots():
    slots = cache()
    slots.ensure(2, 100)
    kvs = fill(slots, 100)
    slots.reserve(8192)
    assert slots.num_store_tokens == 8192
    assert all(torch.equal(slots.read(i, 100), kv) for i, kv in enumerate(kvs))


class Owner:
    payload = None


def test_kept_sessions_live_in_the_store_tail_and_a_growing_layout_packs_them_away():
    slots = cache()
    slots.reserve(8192)
    store = slots._store.data_ptr()
    slots.ensure(2, 300)                           # 8 x 512 tokens: the store's first half
    kvs = fill(slots, 300)
    owners = [Owner(), Owner(), Owner()]
    for owner, (slot, n) in zip(owners, [(0, 100), (1, 300), (0, 50)], strict=True):
        slots.keep(owner, slot, n)
    expected = [kvs[0][:, :, :, :100].clone(), kvs[1].clone(), kvs[0][:, :, :, :50].clone()]
    assert all(o.payload.untyped_storage().data_ptr() == store for o in owners)   # no new memory
    slots.forget(owners[1])                        # a hole in the middle of the tail
    slots.idle()
    slots.ensure(1, 7900)                          # a fresh layout reaching into the tail
    front = slots.tensor.numel()
    assert len(slots.sessions) == 2                # packed together above it, not pushed out
    for owner, kv in ((owners[0], expected[0]), (owners[2], expected[2])):
        assert torch.equal(owner.payload, kv)       # moved, still exact
        assert owner.payload.data_ptr() >= slots._store.data_ptr() + front * 4


def test_a_session_the_tail_cannot_hold_gets_its_own_tensor_and_a_layout_pushes_sessions_out():
    slots = cache(budget_tokens=1024)
    slots.reserve(1024)
    slots.ensure(1, 600)                           # 1 x 768 tokens: most of the store
    kv = fill(slots, 600)[0]
    big, small = Owner(), Owner()
    slots.keep(big, 0, 600)                        # no room left above the layout
    assert big.payload.untyped_storage().data_ptr() != slots._store.data_ptr()
    assert torch.equal(big.payload, kv)
    slots.idle()
    slots.ensure(1, 100, budget_tokens=256)        # 1 x 256
    slots.write(0, kv[:, :, :, :100])
    slots.keep(small, 0, 100)
    assert small.payload.untyped_storage().data_ptr() == slots._store.data_ptr()
    slots.idle()
    slots.ensure(4, 256)                           # 4 x 256, the whole store: the session must move out
    assert small.payload.untyped_storage().data_ptr() != slots._store.data_ptr()
    assert torch.equal(small.payload, kv[:, :, :, :100]) and len(slots.sessions) == 0


def test_without_a_reserved_store_sessions_are_tensors_of_their_own():
    slots = cache()
    slots.ensure(1, 100)
    kv = fill(slots, 100)[0]
    owner = Owner()
    slots.keep(owner, 0, 100)
    slots.ensure(9, 300)                           # a new, larger store: nothing dangles
    assert torch.equal(owner.payload, kv) and len(slots.sessions) == 0


def test_release_frees_it():
    slots = cache()
    slots.ensure(1, 10)
    slots.release()
    assert slots.tensor is None and slots.num_bytes == 0 and slots.num_store_tokens == 0


@pytest.mark.parametrize("source_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_bytes", [4 * 8 * 4, 3 * 40 * 8 * 4, 1 << 20])   # token splits, plane runs, all
def test_raw_pieces_write_what_the_dense_kv_writes(source_dtype, chunk_bytes):
    """A raw transfer's pieces land in a slot exactly where (and as) the dense KV would, also when
    chunks split a plane's tokens or run across layers, and converted to the cache's dtype."""
    kv = torch.randn(2, 2, 2, 40, 8).to(source_dtype)
    dense, from_pieces = cache(), cache()
    for slots in (dense, from_pieces):
        slots.ensure(2, 64)
        torch.manual_seed(1)   # the same neighbours in both: a piece must not touch them
        fill(slots, 64)
    dense.write(1, kv)
    from_pieces.write(1, raw_pieces(kv, chunk_bytes))
    assert torch.equal(dense.tensor, from_pieces.tensor)
    assert torch.equal(from_pieces.read(1, 40), kv.float())
