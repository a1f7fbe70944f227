"""`make bench-kv-device` and the GPU check's two-node run (harness/bench/kv_device_bench.py,
kv_device_cluster.py) on a CPU at the tiny model's size: every mode, stage and limit has a figure,
the wire bytes are what each mode's arithmetic says, the targets are judged from this run's figures,
and the two-node run streams through the device codec path (`[kv] device_codec` is "auto" there:
on a CPU the CPU codec; the on-device path on the CPU is tests/integration/test_cluster_device_codec.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.bench.kv_device_bench import targets

pytestmark = [pytest.mark.integration]


def run_on_the_cpu(module: str, out, *args: str) -> tuple[str, dict]:
    """`python -m harness.bench.<module> --device cpu --model tiny ARGS --json OUT`: (stdout, figures)."""
    run = subprocess.run([sys.executable, "-m", f"harness.bench.{module}", "--device", "cpu", "--model", "tiny",
                          *args, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


def test_the_bench_measures_every_mode_stage_and_limit(tmp_path):
    stdout, figures = run_on_the_cpu("kv_device_bench", tmp_path / "kv.json", "--tokens", "256", "--repeats", "1",
                                    "--modes", "cpu-int8,raw,int8")   # bf16's payloads: test_kv_export.py
    assert figures["env"]["source"] == "random" and figures["env"]["model"] == "tiny" and figures["complete"]
    assert set(figures["limits"]) == {"memcpy_GBps", "d2h_GBps", "h2d_GBps", "socket_GBps"}
    assert all(value > 0 for value in figures["limits"].values())
    stages = figures["stages"]
    assert {key.split(" ", 1)[1] for key in stages} == {"device quantize", "D2H", "H2D", "dequantize", "socket"}
    rows = figures["rows"]
    assert set(rows) == {"256 cpu-int8", "256 raw", "256 int8"}
    values = 2 * 2 * 2 * 256 * 16   # tiny: 2 layers x (K, V) x 2 KV heads x 256 tokens x head_dim 16
    assert rows["256 raw"]["wire_bytes"] >= 4 * values   # float32, plus headers
    assert values <= rows["256 int8"]["wire_bytes"] == rows["256 cpu-int8"]["wire_bytes"] < 2 * values
    for row in rows.values():
        assert row["ttft_s"] > 0 and row["transfer_s"] > 0 and row["share_of_ttft"] > 0 and row["floor_s"] > 0
        assert row["path_s"] > 0 and row["path_over_floor"] == row["path_s"] / row["floor_s"]
    assert "target >= 100" in stdout and "target <= 5 % at 4096" in stdout


def test_targets_are_judged_from_the_figures():
    stages = {"4096 device quantize": (0.004, 512 << 20), "4096 dequantize": (0.01, 512 << 20)}
    rows = {"4096 int8": {"share_of_ttft": 0.04, "path_over_floor": 2.5}}
    lines = targets(stages, rows)
    assert "quantize 134.2 GB/s, dequantize 53.7 GB/s (target >= 100: missed)" in lines[0]
    assert "4.0 % of TTFT (target <= 5 % at 4096: met)" in lines[1] and "2.50x" in lines[1] and lines[1].endswith("missed)")


def test_a_run_cut_short_still_reports_what_it_measured(tmp_path, capsys, monkeypatch):
    """The device call's limit may end the bench mid-run: the JSON saved after each step prints as
    far as it got, and says it is partial."""
    from harness.bench.kv_device_bench import main, save

    path = str(tmp_path / "kv.json")
    figures = {"env": {"device": "cuda", "model": "random-llama-8b", "source": "random-weight", "dtype": "bfloat16",
                       "torch": "2.13.0", "device_name": "H200"}, "complete": False,
               "limits": {"memcpy_GBps": 3000.0, "socket_GBps": 5.0}}
    save(path, figures)
    figures["stages"] = {"1024 device quantize": {"seconds": 0.001, "bytes": 128 << 20},
                         "1024 dequantize": {"seconds": 0.002, "bytes": 128 << 20}}
    figures["rows"] = {"1024 int8": {"ttft_s": 0.2, "transfer_s": 0.004, "send_s": 0.03, "path_s": 0.03,
                                     "wire_bytes": 64 << 20, "share_of_ttft": 0.02, "path_over_floor": 1.5}}
    save(path, figures)
    assert not (tmp_path / "kv.json.part").exists()
    monkeypatch.setattr(sys, "argv", ["kv_device_bench", "--report", path])
    assert main() == 0
    out = capsys.readouterr().out
    assert "memcpy 3000.0 GB/s" in out and "| 1024 | int8 | 200.0 | 4.0 |" in out
    assert "quantize 134.2 GB/s" in out and "2.0 % of TTFT" in out and "a partial run" in out
    del figures["stages"], figures["rows"]
    save(path, figures)
    assert main() == 0
    out = capsys.readouterr().out
    assert "no request finished" in out and "- no stage was measured" in out


def test_two_nodes_stream_and_report_their_transfers(tmp_path):
    _, figures = run_on_the_cpu("kv_device_cluster", tmp_path / "cluster.json", "--tokens", "300", "--modes", "int8,raw")
    rows = figures["rows"]
    assert set(rows) == {"300 int8", "300 raw"}
    for key, row in rows.items():
        assert row["plan"] == "remote" and row["kv_mode"] == key.split()[1]
        assert 0 < row["ttft_s"] < row["second_token_s"] and row["transfer_s"] > 0 and row["wire_bytes"] > 0


def test_the_peer_lands_raw_frames_on_the_device_as_an_engine_copies_them():
    import torch

    from harness.bench.kv_decode_side import land_raw
    from tests.nodes.engines.engine_helpers import raw_pieces

    kv = torch.randn(2, 2, 2, 40, 16).to(torch.bfloat16)
    assert torch.equal(land_raw(raw_pieces(kv, 3000), "cpu"), kv)


def test_an_unknown_mode_is_refused_before_anything_loads(monkeypatch, capsys):
    from harness.bench import kv_device_bench

    monkeypatch.setattr(sys, "argv", ["kv_device_bench", "--device", "cpu", "--modes", "int8,int9"])
    with pytest.raises(SystemExit) as exit_:
        kv_device_bench.main()
    assert exit_.value.code == 2 and "--modes: each of cpu-int8, raw, bf16, int8" in capsys.readouterr().err


def test_the_peer_says_which_transfer_never_came():
    import threading

    from harness.bench.kv_device_bench import Peer

    peer = Peer.__new__(Peer)   # its reader's side only: no process
    peer.lines, peer._ready = [{"transfer_id": "a", "ok": True}], threading.Condition()
    assert peer.landed("a", timeout=0.01)["ok"]
    with pytest.raises(RuntimeError, match="no transfer b within 0 s"):
        peer.landed("b", timeout=0.01)
