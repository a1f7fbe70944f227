"""The brokers and gateways curves of `make bench-scale` (harness/bench/scale_brokers.py), at toy
size: the same load through one and two real brokers, and through one and two gateway processes on
one port, every token relayed either way."""

from __future__ import annotations

import json

import pytest

from harness.bench import scale_brokers

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _rows(directory, tier: str) -> list[dict]:
    (written,) = directory.glob(f"scale-{tier}-*.json")
    return json.loads(written.read_text())["rows"]


def _assert_relayed(row: dict) -> None:
    counters = row["client_counters"]
    assert row["tokens_per_s"] > 0.8 * row["nominal_per_s"] and counters.get("finals", 0) > 0
    assert not [k for k in counters if k.startswith("error.") or k in ("stalled", "out_of_order")]


def test_one_and_two_brokers_relay_the_same_load(tmp_path):
    assert scale_brokers.main(["--brokers", "1,2", "--nodes", "2", "--streams-per-node", "4", "--steps", "0.005",
                               "--seconds", "2", "--skip", "gateways", "--out-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path, "brokers")
    assert [row["brokers"] for row in rows] == [1, 2] and not list(tmp_path.glob("scale-gateways-*"))
    for row in rows:
        _assert_relayed(row)


def test_one_and_two_gateway_processes_serve_the_same_http_load(tmp_path):
    assert scale_brokers.main(["--gateways", "1,2", "--http-steps", "0.02", "--http-clients", "1",
                               "--seconds", "2", "--skip", "brokers", "--out-dir", str(tmp_path)]) == 0
    rows = _rows(tmp_path, "gateways")
    assert [row["gateways"] for row in rows] == [1, 2]
    for row in rows:
        _assert_relayed(row)
        assert row["gateway_cpu_frac"] > 0 and row["transport"] == "http"
