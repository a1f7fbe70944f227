"""bus/ knows nothing of models: importing the whole KV package must not pull in torch."""

from __future__ import annotations

import subprocess
import sys


def test_bus_kv_does_not_import_torch():
    code = "import sys, bus.kv, bus.kv.sender, bus.kv.receiver; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
