"""The brokers curve of `make bench-scale` (harness/bench/scale_brokers.py), at toy size: the same
load through one and two real brokers, every token relayed either way."""

from __future__ import annotations

import json

import pytest

from harness.bench import scale_brokers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_and_two_brokers_relay_the_same_load(tmp_path, capsys):
    assert scale_brokers.main(["--brokers", "1,2", "--nodes", "2", "--streams-per-node", "4", "--steps", "0.005",
                               "--seconds", "2", "--out-dir", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("scale-brokers-*.json")
    rows = json.loads(written.read_text())["rows"]
    assert [row["brokers"] for row in rows] == [1, 2]
    for row in rows:
        counters = row["client_counters"]
        assert row["tokens_per_s"] > 0.8 * row["nominal_per_s"] and counters.get("finals", 0) > 0
        assert not [k for k in counters if k.startswith("error.") or k in ("stalled", "out_of_order")]
