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


def plain_vllm(prompts: list[tuple[int, ...]], max_tokens: int, dtype: str = "bfloat16") -> list[list[int]]:
    """Greedy ids from vLLM alone (its own process, no pdbus code), one prompt at a time."""
    folder = open_model_folder(MODEL).folder
    run = subprocess.run([sys.executable, "-m", "tests.integration.vllm_reference", str(folder), str(max_tokens),
                          dtype], input=json.dumps([list(p) for p in prompts]), capture_output=True, text=True,
                         cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["outputs"]
