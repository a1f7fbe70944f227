"""bench-kv's per-thread CPU accounting: /proc read per thread group, and a run over real sockets."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from bus.kv import KVReceiver, ReceiveConfig
from harness.bench.kv_cpu import (
    CPU_CASES,
    GROUPS,
    print_cpu_accounting,
    run_cpu_accounting,
    thread_cpu_seconds,
)
from nodes.engines.kv_quant import TorchQuantizer
from tests.harness.bench.kv_servers import start_baseline_servers, stop_servers

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_busy_thread_counts_in_other_and_the_caller_in_main():
    spun, release = threading.Event(), threading.Event()

    def work() -> None:
        _spin(0.2)
        spun.set()
        release.wait()   # alive when read: a thread that ended is no longer listed

    before = thread_cpu_seconds(os.getpid())
    worker = threading.Thread(target=work)
    worker.start()
    spun.wait()   # one at a time: two spinning threads would share the GIL however the OS pleases
    _spin(0.2)
    after = thread_cpu_seconds(os.getpid())
    release.set()
    worker.join()
    assert after["main"] - before["main"] >= 0.15
    assert after.get("other", 0.0) - before.get("other", 0.0) >= 0.15
    assert set(after) <= set(GROUPS)


def test_a_process_that_is_gone_reads_as_nothing():
    assert thread_cpu_seconds(2**22 + 12345) == {}


async def test_every_case_runs_and_is_accounted_on_both_sides(capsys):
    received = []
    receiver = KVReceiver(quantizer=TorchQuantizer(), config=ReceiveConfig(transfer_timeout=5.0),
                          on_result=received.append)
    servers, endpoints, tasks = await start_baseline_servers()
    endpoints["kv"] = await receiver.start()
    sources = {"fp32": torch.randn(4, 2, 3, 64, 16)}
    # The receiver shares this process here: both sides read this process's threads.
    results = await run_cpu_accounting(endpoints, os.getpid(), sources, TorchQuantizer(), 3 * 64 * 16 * 4, 3)
    await stop_servers(servers, tasks)
    await receiver.close()
    assert set(results) == {("fp32", case) for case in CPU_CASES}
    assert all(row["wall"] > 0 and min(row.values()) >= 0 for row in results.values())
    assert all(set(row) == {"wall"} | {f"{side} {group}" for side in ("sender", "receiver") for group in GROUPS}
               for row in results.values())
    assert len(received) == 2 * (5 + 3) and all(result.ok for result in received)   # warm-ups too
    print_cpu_accounting(results, 3)
    table = capsys.readouterr().out
    assert all(f"| fp32 | {case} |" in table for case in CPU_CASES)
