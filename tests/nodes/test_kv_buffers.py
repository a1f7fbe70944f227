"""The decode node's pool of KV buffers (nodes/kv_buffers.py): exact shapes over reused memory,
best fit, bounded free list, idempotent hand-back, and safe use from two threads."""

from __future__ import annotations

import math
import threading

import torch

from nodes.kv_buffers import ALIGN_ELEMENTS, KVBufferPool

SHAPE = (2, 2, 3, 40, 8)


def test_a_handed_back_buffer_is_reused_for_the_next_take():
    pool = KVBufferPool()
    first = pool.take(SHAPE, torch.float32)
    assert first.shape == SHAPE and first.is_contiguous() and first.dtype == torch.float32
    address = first.data_ptr()
    pool.give(first)
    second = pool.take(SHAPE, torch.float32)
    assert second.data_ptr() == address and pool.num_allocated == 1
    assert pool.num_taken == 1 and pool.num_free == 0


def test_takes_the_smallest_free_buffer_that_fits_and_never_one_of_another_dtype():
    pool = KVBufferPool()
    big = pool.take((4 * ALIGN_ELEMENTS,), torch.float32)
    small = pool.take((ALIGN_ELEMENTS,), torch.float32)
    other = pool.take((ALIGN_ELEMENTS,), torch.bfloat16)
    for tensor in (big, small, other):
        pool.give(tensor)
    assert pool.take((ALIGN_ELEMENTS // 2,), torch.float32).data_ptr() == small.data_ptr()
    assert pool.take((ALIGN_ELEMENTS // 2,), torch.bfloat16).data_ptr() == other.data_ptr()
    # far too big for a small request (more than twice its size): a new buffer instead
    assert pool.take((ALIGN_ELEMENTS // 2,), torch.float32).data_ptr() != big.data_ptr()
    assert pool.num_allocated == 4


def test_too_small_a_free_buffer_is_not_used():
    pool = KVBufferPool()
    pool.give(pool.take((ALIGN_ELEMENTS,), torch.float32))
    bigger = pool.take((3 * ALIGN_ELEMENTS,), torch.float32)
    assert bigger.numel() == 3 * ALIGN_ELEMENTS and pool.num_allocated == 2 and pool.num_free == 1


def test_hand_back_is_idempotent_and_ignores_tensors_from_elsewhere():
    pool = KVBufferPool()
    taken = pool.take(SHAPE, torch.float32)
    pool.give(taken)
    pool.give(taken)
    pool.give(torch.empty(SHAPE))
    pool.give(None)
    assert pool.num_free == 1 and pool.num_taken == 0


def test_free_buffers_are_bounded_oldest_dropped_first():
    pool = KVBufferPool(max_free=2)
    tensors = [pool.take(SHAPE, torch.float32) for _ in range(3)]
    for tensor in tensors:
        pool.give(tensor)
    assert pool.num_free == 2
    kept = {pool.take(SHAPE, torch.float32).data_ptr() for _ in range(2)}
    assert kept == {t.data_ptr() for t in tensors[1:]}


def test_two_threads_taking_and_giving_never_share_a_buffer():
    pool = KVBufferPool(max_free=8)
    failures = []

    def worker(value: float) -> None:
        for _ in range(200):
            tensor = pool.take(SHAPE, torch.float32)
            tensor.fill_(value)
            if not bool((tensor == value).all()):
                failures.append(value)
            pool.give(tensor)

    threads = [threading.Thread(target=worker, args=(v,)) for v in (1.0, 2.0, 3.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and pool.num_taken == 0 and pool.num_allocated <= 3


def test_drop_free_lets_go_of_waiting_buffers_but_not_of_taken_ones():
    pool = KVBufferPool()
    kept = pool.take(SHAPE, torch.float32)
    pool.give(pool.take(SHAPE, torch.float32))
    assert pool.drop_free() == math.prod(SHAPE) * 4 + (-math.prod(SHAPE)) % ALIGN_ELEMENTS * 4
    assert pool.num_free == 0 and pool.num_taken == 1
    pool.give(kept)
    assert pool.num_free == 1


def test_drop_free_can_keep_the_last_buffer_given_back_when_it_is_small_enough():
    pool = KVBufferPool()
    small, big = pool.take((4, 1024), torch.float32), pool.take((8, ALIGN_ELEMENTS), torch.float32)
    pool.give(big)
    pool.give(small)                               # the last one back
    size = ALIGN_ELEMENTS * 4                      # small's buffer: one alignment step of float32
    assert pool.num_free_bytes == size + 8 * ALIGN_ELEMENTS * 4
    assert pool.drop_free(keep_bytes=size) == 8 * ALIGN_ELEMENTS * 4
    assert pool.num_free == 1 and pool.num_free_bytes == size
    assert pool.drop_free(keep_bytes=size - 1) == size and pool.num_free == 0   # too big to keep
