"""Sessions' KV in the tail of a store (nodes/engines/session_tail.py): placed high, packed by
compaction (overlapping moves included), pushed out into copies of their own when a layout needs
the room, and always reading exactly what was kept."""

from __future__ import annotations

import random

import torch

from nodes.engines.session_tail import SessionTail


class Owner:
    payload = None


def check(tail: SessionTail, store: torch.Tensor, expected: dict, front: int = 0) -> None:
    spans = []
    for owner, values in expected.items():
        assert torch.equal(owner.payload, values)
        if tail.holds(owner):
            start = (owner.payload.data_ptr() - store.data_ptr()) // store.element_size()
            spans.append((start, start + owner.payload.numel()))
            assert start >= front
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))   # no two overlap
    assert all(end <= store.numel() for _, end in spans)


def test_placed_sessions_read_back_and_fill_the_store_from_its_end():
    store, tail = torch.zeros(100), SessionTail()
    a, b = Owner(), Owner()
    assert tail.place(store, a, torch.arange(30.0), front=0) and tail.place(store, b, torch.ones(2, 5), front=0)
    assert tail.start(store) == 60 and tail.num_elements == 40 and len(tail) == 2
    check(tail, store, {a: torch.arange(30.0), b: torch.ones(2, 5)})
    assert not tail.place(store, Owner(), torch.ones(61), front=0)   # no room: the caller keeps its own


def test_compaction_closes_holes_even_when_a_block_overlaps_its_old_place():
    store, tail = torch.zeros(100), SessionTail()
    owners = [Owner() for _ in range(3)]
    values = [torch.full((n,), float(i + 1)) for i, n in enumerate((10, 5, 40))]   # at 90, 85, 45
    for owner, v in zip(owners, values, strict=True):
        assert tail.place(store, owner, v, front=0)
    tail.forget(owners[1])                         # a 5-element hole: the 40-block moves up by 5
    tail.make_room(store, front=50)
    assert tail.start(store) == 50
    check(tail, store, {owners[0]: values[0], owners[2]: values[2]}, front=50)


def test_make_room_pushes_the_lowest_sessions_out_into_copies():
    store, tail = torch.zeros(100), SessionTail()
    a, b = Owner(), Owner()
    tail.place(store, a, torch.full((30,), 1.0), front=0)
    tail.place(store, b, torch.full((30,), 2.0), front=0)
    tail.make_room(store, front=60)
    assert tail.holds(a) and not tail.holds(b)
    store[:60] = -1.0                              # the layout writes its room: b is unharmed
    check(tail, store, {a: torch.full((30,), 1.0), b: torch.full((30,), 2.0)}, front=60)
    tail.evict_all()
    store[:] = -1.0
    check(tail, store, {a: torch.full((30,), 1.0), b: torch.full((30,), 2.0)})


def test_random_places_forgets_and_fronts_never_lose_a_value():
    rng = random.Random(7)
    store, tail, expected = torch.zeros(1000), SessionTail(), {}
    for _ in range(400):
        op = rng.random()
        front = rng.randrange(0, 600)
        if op < 0.5:
            owner, values = Owner(), torch.randn(rng.randrange(1, 120))
            if not tail.place(store, owner, values, front):
                owner.payload = values.clone()
            expected[owner] = values
        elif op < 0.8 and expected:
            owner = rng.choice(list(expected))
            tail.forget(owner)
            del expected[owner]
        else:
            tail.make_room(store, front)
            store[:front] = float("nan")           # whatever the layout writes there
        check(tail, store, expected, front=0)
