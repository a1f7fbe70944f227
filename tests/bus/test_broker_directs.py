"""HeldDirects: DIRECTs for a node not registered yet are kept for the grace, in order, bounded."""

from __future__ import annotations

from bus.broker_directs import HeldDirects


def test_held_directs_are_released_to_their_peer_in_order():
    held = HeldDirects(grace_s=1.0)
    assert held.hold("d1", b"A", [b"x", b"1"], 0.0) and held.hold("d2", b"A", [b"y"], 0.1)
    assert held.hold("d1", b"B", [memoryview(b"x2")], 0.2)   # frames are copied to bytes
    assert held.release("d1") == [[b"x", b"1"], [b"x2"]] and len(held) == 1
    assert held.release("d1") == []


def test_past_the_grace_the_sender_is_told_in_arrival_order():
    held = HeldDirects(grace_s=1.0)
    held.hold("d1", b"A", [b"x"], 0.0)
    held.hold("d2", b"B", [b"y"], 0.5)
    assert held.expire(0.99) == []
    assert held.expire(1.0) == [(b"A", "d1")]
    assert held.expire(2.0) == [(b"B", "d2")] and len(held) == 0


def test_a_full_store_refuses_so_the_broker_answers_at_once():
    held = HeldDirects(grace_s=1.0, max_held=1)
    assert held.hold("d1", b"A", [b"x"], 0.0)
    assert not held.hold("d2", b"A", [b"y"], 0.0)
