"""harness/bench/grammar_mask.py measures what it reports (a quick in-process run on the tiny
tokenizer; the bench itself runs each library in a pinned child process)."""

from __future__ import annotations

import importlib.util

import pytest

from harness.bench import grammar_mask


@pytest.mark.parametrize("library", grammar_mask.LIBRARIES)
def test_one_measurement_on_the_tiny_tokenizer(library):
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (only llguidance is a dependency)")
    row = grammar_mask.measure(library, "tiny", repeats=1, wide=(10, 20))
    assert row["vocab_size"] == 512 and set(row["grammars"]) == set(grammar_mask.GRAMMARS)
    for grammar in row["grammars"].values():
        assert grammar["doc_tokens"] > 10 and 0 < grammar["mask_us"]["p50"] <= grammar["mask_us"]["p99"]
    assert set(row["wide_schema_compile_ms"]) == {"10", "20"}
    assert row["apply_us"]["pdbus_float32"] > 0 and 0 < row["apply_us"]["allowed_fraction"] < 1


def test_the_table_prints(capsys):
    row = grammar_mask.measure("llguidance", "tiny", repeats=1, wide=(10,))
    grammar_mask.print_table([row])
    assert "nested_schema" in capsys.readouterr().out
