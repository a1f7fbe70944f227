"""The shared-core probe: interleaved pairs of rates, their ratios, the JSON it writes."""

from __future__ import annotations

import io
import json
import os

import pytest

from harness.bench import core_share


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_probe_measures_alone_and_beside(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(core_share, "SIZE", 128)
    monkeypatch.setattr(core_share, "ROUNDS", 2)
    monkeypatch.setattr(core_share, "PAIRS", 2)
    affinity = os.sched_getaffinity(0)
    try:
        assert core_share.main(["--dtypes", "float32", "--json", str(tmp_path / "c.json")]) == 0
    finally:
        os.sched_setaffinity(0, affinity)
    row = json.loads((tmp_path / "c.json").read_text())["dtypes"]["float32"]
    assert row["alone_tflops"] > 0 and row["beside_tflops"] > 0
    assert len(row["ratios"]) == 2 and all(r > 0 for r in row["ratios"])
    assert row["ratio"] == pytest.approx(sum(row["ratios"]) / 2, rel=0.01)     # the median of two
    assert "float32 matmul 128^3" in capsys.readouterr().out


def test_one_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(core_share.os, "sched_getaffinity", lambda pid: {0})
    assert core_share.main([]) == 2


def test_a_loader_that_never_starts_is_a_clear_error(monkeypatch):
    class Silent:
        stdout = io.StringIO("")          # exited before its "multiplying" line
        killed = False

        def kill(self) -> None:
            Silent.killed = True

        def wait(self) -> None: ...

    monkeypatch.setattr(core_share.subprocess, "Popen", lambda *args, **kwargs: Silent())
    monkeypatch.setattr(core_share.os, "sched_setaffinity", lambda pid, cpus: None)
    with pytest.raises(RuntimeError, match="did not start"):
        core_share.measure("float32", 0, 1)
    assert Silent.killed
