"""The `pdbus` console script: help, unknown commands, lazy imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nodes.cli import SUBCOMMANDS, main


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_every_subcommand_module_exists_and_has_the_contract():
    import importlib

    for module_name, _ in SUBCOMMANDS.values():
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.main)


def test_broker_command_does_not_import_torch():
    code = "import sys; from nodes.cli import build_parser; build_parser('broker'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_decode_node_whose_kv_budget_exceeds_the_memory_exits_2_with_one_line():
    env = {**os.environ, "PDBUS__DECODE__NUM_KV_BLOCKS": str(10**12)}   # petabytes of KV
    done = subprocess.run([sys.executable, "-m", "nodes.cli", "decode", "--model", "tiny",
                           "--broker", "tcp://127.0.0.1:9"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("pdbus decode: the KV budget") and "preallocate_kv = false" in line


def test_a_node_asked_for_a_gpu_torch_cannot_see_exits_2_with_one_line():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    done = subprocess.run([sys.executable, "-m", "nodes.cli", "prefill", "--model", "tiny", "--device", "cuda",
                           "--broker", "tcp://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("pdbus prefill: [engine] device = 'cuda', but torch")
    assert "Traceback" not in done.stderr
