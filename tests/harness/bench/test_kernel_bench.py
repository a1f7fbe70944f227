"""The kernel benchmark end to end on its cheapest operation (quick shapes, one round), and its
timing, verdict and agreement rules on stand-ins."""

from __future__ import annotations

import json
import math

import pytest
import torch

from harness.bench import kernel_bench as bench
from harness.bench import kernel_cases as cases
from nodes.engines.kernels import dispatch


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_quick_norm_rope_prints_the_table_and_writes_the_json(capsys, tmp_path):
    assert bench.main(["--only", "norm_rope", "--quick", "--rounds", "1", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# kernel_bench: {bench.cpu_model()} | features: ")
    lines = out.splitlines()
    header = lines.index("| " + " | ".join(bench.COLUMNS) + " |")
    rows = [_cells(line) for line in lines[header + 2:] if line.startswith("| ")]
    # float32 leaves RMSNorm and RoPE to torch on every CPU: a skip with its reason, never a row
    assert "skipped: norm_rope (float32): the plan's norm_rope is 'torch'" in lines
    [path] = tmp_path.glob("kernels-*.json")
    report = json.loads(path.read_text())
    assert report["rounds"] == 1 and report["quick"] is True and report["cpu"] == bench.cpu_model()
    if dispatch.plan("bfloat16", "cpu").norm_rope != "bf16":   # a CPU (or mask) without the kernels
        assert not rows and report["rows"] == []
        return
    assert [(r[0], r[1], r[2]) for r in rows] == [("norm_rope", "norm_rope.bf16.rms_norm", "bfloat16"),
                                                  ("norm_rope", "norm_rope.bf16.rope_and_cache", "bfloat16")]
    for row, cells in zip(report["rows"], rows, strict=True):
        assert math.isfinite(row["gain"]) and row["gain"] > 0
        assert row["kernel_us"] > 0 and row["torch_us"] > 0 and len(row["ratios"]) == 1
        assert row["verdict"] == cells[-1] and row["verdict"] in ("keeps its place", "DELETE: below 1.2x")
        assert cells[6] == f"{row['gain']:.2f}x"


def case(operation: str, shape: str) -> cases.Case:
    return cases.Case(operation, "m", "bfloat16", shape, lambda: None, lambda: None, lambda: None,
                      whole_step=shape.startswith("decode step"))


@pytest.mark.parametrize(("gain", "verdict"), [(1.2, "keeps its place"), (3.0, "keeps its place"),
                                               (1.19, "DELETE: below 1.2x"), (0.5, "DELETE: below 1.2x")])
def test_the_verdict_keeps_a_kernel_from_a_gain_of_1_2(gain, verdict):
    assert bench.verdict(case("norm_rope", "512 x 576"), gain) == verdict
    assert bench.verdict(case("linear", "decode step, 1 rows: vs the engine's torch linear"), gain) == verdict


def test_a_linear_kernel_below_the_bar_defers_to_its_decode_step():
    assert bench.verdict(case("linear", "8 layers, 1-row step"), 0.9) == "below 1.2x: its decode step decides"
    assert bench.verdict(case("linear", "8 layers, 1-row step"), 1.5) == "keeps its place"


def test_quick_linear_times_the_decode_step_with_and_without_the_kernel(capsys, tmp_path):
    assert bench.main(["--only", "linear", "--dtype", "float32", "--quick", "--rounds", "1",
                       "--out-dir", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("kernels-*.json")).read_text())
    if dispatch.plan("float32", "cpu").linear != "dot_f32":
        assert report["rows"] == []
        return
    steps = [row for row in report["rows"] if row["shape"].startswith("decode step")]
    assert [row["shape"] for row in steps] == ["decode step, 1 rows: vs the engine's torch linear"]
    assert steps[0]["gain"] > 0 and not steps[0]["verdict"].startswith("MISMATCH")


def test_paired_rounds_report_the_median_of_per_round_ratios():
    calls = {"kernel": 0, "torch": 0}

    def side(name):
        return lambda: calls.__setitem__(name, calls[name] + 1)
    timed = bench.paired_rounds(side("kernel"), side("torch"), rounds=3, seconds=0.001)
    assert len(timed["ratios"]) == 3 and timed["gain"] == sorted(timed["ratios"])[1]
    assert timed["kernel_us"] > 0 and timed["torch_us"] > 0
    assert calls["kernel"] == 2 + 3 * timed["kernel_calls"] and calls["torch"] == 2 + 3 * timed["torch_calls"]


def test_a_pair_that_disagrees_is_reported_and_not_timed():
    def never():
        raise AssertionError("a mismatched pair must not be timed")
    case = cases.Case("linear", "linear.x", "bfloat16", "1 layer", never, never, lambda: "max |diff| 1")
    row = bench.measure(case, rounds=3, seconds=0.001)
    assert row["verdict"] == "MISMATCH: max |diff| 1" and row["gain"] is None
    assert bench._line(row) == "| linear | linear.x | bfloat16 | 1 layer | - | - | - | MISMATCH: max |diff| 1 |"


def test_close_allows_a_few_bf16_ulps_of_the_output_scale():
    want = torch.tensor([2.0, -0.5, 1.0], dtype=torch.bfloat16)   # scale 2: an ulp there is 2**-6
    assert cases.close(want + 4 * 2.0**-6, want) is None
    assert cases.close(want + 6 * 2.0**-6, want) is not None
    assert cases.close(torch.full((3,), float("nan"), dtype=torch.bfloat16), want) is not None
    want32 = torch.tensor([1000.0, 1.0])
    assert cases.close(want32 + 0.1, want32) is None and cases.close(want32 + 1.0, want32) is not None
