"""bus/ and scheduler/ know nothing of models: importing them pulls in no torch, numba or llvmlite."""

from __future__ import annotations

import subprocess
import sys

import pytest

PACKAGES = "bus, bus.kv, bus.kv.sender, bus.kv.receiver, bus.broker, bus.endpoint, scheduler, scheduler.policy"


@pytest.mark.parametrize("module", ["torch", "numba", "llvmlite"])
def test_bus_and_scheduler_do_not_import(module):
    code = f"import sys, {PACKAGES}; sys.exit({module!r} in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
