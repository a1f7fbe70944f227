"""Packaging: a serving node installs no benchmark-only dependency, and importing the node and
gateway code pulls none in (matplotlib, transformers and the other HTTP stack live in the `bench`
extra, which `dev` and the bench targets install)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.conftest import REPO_ROOT

BENCH_ONLY = ("matplotlib", "transformers", "accelerate", "starlette", "uvicorn", "httptools")


def _names(requirements: list[str]) -> set[str]:
    return {r.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip().lower() for r in requirements}


def test_runtime_dependencies_hold_nothing_only_the_benchmarks_use():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & set(BENCH_ONLY)
    assert set(BENCH_ONLY) <= _names(project["optional-dependencies"]["bench"])
    assert "pdbus[bench]" in project["optional-dependencies"]["dev"]


def test_serving_code_imports_no_benchmark_dependency():
    code = ("import sys, nodes.cli, nodes.gateway.app, nodes.decode_node, nodes.prefill_node, bus.broker;"
            f"print(sorted(m for m in {BENCH_ONLY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.strip() == "[]"
