"""One enum for every code a cluster request can end with (nodes/wire/codes.py)."""

from __future__ import annotations

from bus.constants import ErrorCode
from nodes import wire


def test_every_bus_code_is_a_cluster_code_with_the_same_value():
    assert {code.value for code in ErrorCode} <= {code.value for code in wire.Code}
    for code in ErrorCode:
        assert wire.Code[code.name] == code and wire.Code[code.name].value == code.value


def test_values_are_unique_and_plain_snake_case():
    values = [code.value for code in wire.Code]
    assert len(values) == len(set(values)) and all(v.isascii() and v == v.lower() for v in values)


def test_a_metric_label_is_a_known_code_or_other():
    assert wire.code_label("full") == "full" and wire.code_label("prefill_kv_failed") == "prefill_kv_failed"
    assert wire.code_label("node_lost") == "node_lost" and wire.code_label("made-up") == "other"
    assert wire.code_label("prefill_made-up") == "other"
