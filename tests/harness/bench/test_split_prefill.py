"""`make bench-split` on the tiny model: three workers start, every system is timed for every
length, and the JSON holds a median per (length, system)."""

from __future__ import annotations

import json

from harness.bench.split_prefill import SPLIT_CHUNKS, _chunks, main


def test_chunks_cover_the_prompt_in_order():
    assert _chunks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert _chunks(8, 1) == [(0, 8)]


def test_the_bench_times_every_system_for_every_length(tmp_path, capsys):
    out = tmp_path / "split.json"
    assert main(["--model", "tiny", "--lengths", "24,40", "--rounds", "1", "--json", str(out)]) == 0
    seconds = json.loads(out.read_text())["seconds"]
    systems = {"one core", "two threads"} | {f"split {c}" for c in SPLIT_CHUNKS}
    assert set(seconds) == {"24", "40"} and all(set(by) == systems for by in seconds.values())
    assert all(0 < v < 60 for by in seconds.values() for v in by.values())
    assert "40 tokens: one core" in capsys.readouterr().out
