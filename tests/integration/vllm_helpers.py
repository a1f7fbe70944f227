"""Shared by the `vllm`-marked tests: skip without vLLM, plain-vLLM reference outputs, cluster settings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.engines.model_loader import open_model_folder

MODEL = "SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parents[2]
VLLM_ENGINE = {"engine": {"kind": "vllm", "dtype": "bfloat16", "num_threads": 1}}

requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                   reason="vLLM is not installed: `make test-vllm` installs it and runs these tests")


def run_worker(module: str, args: list[str], payload) -> dict:
    """Run a test worker module in its own process (one vLLM engine per process); its last line as JSON."""
    run = subprocess.run([sys.executable, "-m", module, *args], input=json.dumps(payload), capture_output=True,
                         text=True, cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def plain_vllm(prompts: list[tuple[int, ...]], max_tokens: int, dtype: str = "bfloat16") -> list[list[int]]:
    """Greedy ids from vLLM alone (its own process, no pdbus code), one prompt at a time."""
    folder = open_model_folder(MODEL).folder
    return run_worker("tests.integration.vllm_reference", [str(folder), str(max_tokens), dtype],
                      [list(p) for p in prompts])["outputs"]
