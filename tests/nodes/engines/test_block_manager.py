"""Block accounting (plain data)."""

from __future__ import annotations

import pytest

from nodes.engines.block_manager import BlockManager, KvBudgetExceeded


def test_allocate_rounds_up_to_blocks_and_free_returns_them():
    blocks = BlockManager(num_blocks=10, block_size=16)
    assert len(blocks.allocate("a", 17)) == 2
    assert blocks.num_free_blocks == 8
    assert blocks.free("a") == 2
    assert blocks.num_free_blocks == 10


def test_free_is_idempotent():
    blocks = BlockManager(4, 16)
    blocks.allocate("a", 16)
    assert blocks.free("a") == 1
    assert blocks.free("a") == 0
    assert blocks.num_free_blocks == 4


def test_over_allocation_raises_and_changes_nothing():
    blocks = BlockManager(4, 16)
    blocks.allocate("a", 48)
    with pytest.raises(KvBudgetExceeded):
        blocks.allocate("b", 32)
    assert blocks.num_free_blocks == 1
    assert blocks.owners() == ["a"]


def test_resize_grows_and_shrinks():
    blocks = BlockManager(8, 4)
    blocks.allocate("a", 4)
    blocks.resize("a", 13)
    assert blocks.num_blocks_of("a") == 4
    blocks.resize("a", 5)
    assert blocks.num_blocks_of("a") == 2
    assert blocks.num_free_blocks == 6


def test_double_allocate_is_an_error():
    blocks = BlockManager(8, 4)
    blocks.allocate("a", 4)
    with pytest.raises(ValueError):
        blocks.allocate("a", 4)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        BlockManager(0, 16)


def test_rename_moves_the_blocks_and_refuses_a_taken_name():
    blocks = BlockManager(num_blocks=4, block_size=1)
    blocks.allocate("a", 2)
    blocks.allocate("b", 1)
    blocks.rename("a", "c")
    assert blocks.num_blocks_of("c") == 2 and blocks.num_blocks_of("a") == 0
    with pytest.raises(ValueError):
        blocks.rename("c", "b")
    assert blocks.num_blocks_of("c") == 2


def test_ids_come_never_used_first_then_in_the_order_they_came_back():
    blocks = BlockManager(num_blocks=6, block_size=1)
    assert blocks.allocate("a", 2) == [0, 1] and blocks.allocate("b", 2) == [2, 3]
    blocks.free("b")
    blocks.free("a")
    assert blocks.allocate("c", 6) == [4, 5, 2, 3, 0, 1]   # what one deque of every id gave
    assert blocks.num_free_blocks == 0


def test_a_budget_of_a_trillion_blocks_costs_nothing_to_set_up():
    blocks = BlockManager(num_blocks=10**12, block_size=16)
    assert blocks.num_free_blocks == 10**12 and blocks.allocate("a", 40) == [0, 1, 2]
