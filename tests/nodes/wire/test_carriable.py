"""What the bus can carry (nodes/wire/carriable.py): UTF-8 strings, 64-bit ints, finite floats and
bounded depth, with the path of the first value it cannot."""

from __future__ import annotations

import pytest

from nodes import wire


def test_carriable_means_utf8_strings_64_bit_ints_finite_floats_and_bounded_depth():
    wire.check_carriable({"a": [1, -(2 ** 63), 2 ** 64 - 1, 0.5, "é", b"\xff", None, True]})
    nested: object = 1
    for _ in range(wire.MAX_DEPTH):
        nested = [nested]
    wire.check_carriable(nested)   # MAX_DEPTH containers deep: the most the bus takes
    for value, path in (([nested], "body" + "[0]" * wire.MAX_DEPTH), ({"k": 2 ** 64}, "body.k"),
                        ({"\ud800": 1}, "body"), ({"f": float("inf")}, "body.f"), ({"o": object()}, "body.o"),
                        ({1: 2}, "body")):
        with pytest.raises(wire.Uncarriable) as info:
            wire.check_carriable(value)
        assert info.value.path == path


def test_a_request_is_checked_before_it_is_built_for_the_bus():
    wire.check_request((1, 2), wire.SamplingParams(stop=("ok",)), "s")
    with pytest.raises(wire.Uncarriable) as info:
        wire.check_request((1, 2), wire.SamplingParams(stop=("ok", "\udfff")), "s")
    assert info.value.path == "sampling.stop[1]"
    with pytest.raises(wire.Uncarriable) as info:
        wire.check_routing_key("k" * 129, "session_id")
    assert info.value.path == "session_id"
