"""bench-kv's report of auto / none beside its null pair (harness/bench/kv_report.py)."""

from __future__ import annotations

import pytest

from harness.bench.kv_auto import AUTO_BASES
from harness.bench.kv_bench import CASES
from harness.bench.kv_report import paired_ratio, print_null_pairs


def results_with(auto: float, again: float) -> dict:
    """Per-round times: `none` 10 ms, `auto` and `none again` the given multiples of it each round."""
    rounds = [0.010 * (1 + r / 100) for r in range(5)]   # the machine drifts; the ratios do not
    out = {}
    for base in AUTO_BASES:
        for twin, factor in (("none", 1.0), ("auto", auto), ("none again", again)):
            times = [t * factor for t in rounds]
            out[f"{base}+{twin}"] = (min(times), 1.0, times[2], times)
    return out


def test_every_auto_case_has_a_null_twin_run_in_the_same_rounds():
    keys = {f"{d} {m}+{c}" for d, m, c in CASES}
    assert all({f"{b}+none", f"{b}+auto", f"{b}+none again"} <= keys for b in AUTO_BASES)


def test_the_null_pair_is_printed_beside_auto_as_medians_of_per_round_ratios(capsys):
    loop, shaped = results_with(1.02, 1.0), results_with(0.99, 1.05)
    assert paired_ratio(loop, "fp32 int8+auto", "fp32 int8+none") == 1.02
    print_null_pairs(loop, shaped)
    table = capsys.readouterr().out
    assert "| loopback, fp32 int8 | 1.020 (1.020–1.020) | 1.000 (1.000–1.000) |" in table
    assert "| 10 Gbit/s, bf16 raw | 0.990 (0.990–0.990) | 1.050 (1.050–1.050) |" in table


@pytest.mark.parametrize("module", ["harness.bench.kv_bench", "harness.bench.kv_quality"])
def test_importing_the_bench_leaves_the_environment_alone(module):
    import os
    import subprocess
    import sys
    code = f"import os, {module}; print(os.environ.get('PDBUS_LOG_LEVEL'), os.environ.get('OMP_NUM_THREADS'))"
    env = {k: v for k, v in os.environ.items() if k not in ("PDBUS_LOG_LEVEL", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["None", "None"]   # the cluster tests' children inherit it otherwise
