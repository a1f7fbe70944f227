"""Zero false deaths while both cores are saturated: a node whose main thread runs
multi-second numpy matmuls (BLAS on both cores) and then pure-Python compute (which holds the
GIL), beside a process that burns CPU, stays registered: the broker never declares it dead and
it never loses the broker. Its endpoint's I/O thread keeps heartbeating throughout."""

from __future__ import annotations

import pytest

from tests.bus.processes import free_port, python_process, start_broker

pytestmark = pytest.mark.integration

BUSY_NODE = """
import sys, time
import numpy as np
from bus.endpoint import Endpoint
from bus.log import configure_logging, get_logger
configure_logging("json", "info")
log = get_logger("busy")
endpoint = Endpoint(sys.argv[1], "decode", "busy").start()
assert endpoint.wait_registered(30)
matrix = np.random.default_rng(0).random((3200, 3200))
log.info("compute_started")
num_matmuls, deadline = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    start = time.monotonic()
    matrix = matrix @ matrix
    matrix /= np.abs(matrix).max()
    num_matmuls += 1
    log.info("matmul", seconds=round(time.monotonic() - start, 2))
deadline = time.monotonic() + float(sys.argv[3])
total = 0
while time.monotonic() < deadline:   # pure Python: holds the GIL between switch intervals
    total += sum(i * i for i in range(100_000))
log.info("compute_done", num_matmuls=num_matmuls, metrics=endpoint.metrics())
endpoint.stop()
"""

BURNER = "while True: pass"


def test_no_false_deaths_under_saturating_compute():
    port = free_port()
    broker = start_broker(port)
    burner = python_process(BURNER)
    node = python_process(BUSY_NODE, f"tcp://127.0.0.1:{port}", "6", "2",
                          env={"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"})
    try:
        broker.wait_for("node_joined", node_id="busy", timeout=30)
        node.wait_for("compute_started", timeout=30)
        done = node.wait_for("compute_done", timeout=90)
        assert done["num_matmuls"] >= 1
        deaths = [e for e in broker.find("node_left", node_id="busy") if e["reason"] != "disconnected"]
        assert not deaths, "the broker declared a busy node dead"   # (it says goodbye when done)
        assert not node.find("broker_lost"), "the busy node lost the broker"
        assert done["metrics"].get("link.registered") == 1
        # The endpoint's own measure of its worst stall stays well inside the liveness window.
        assert done["metrics"]["tick.max_gap_ms"] < 750
    finally:
        for process in (node, burner, broker):
            process.stop()
