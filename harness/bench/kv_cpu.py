"""Where the CPU of a KV transfer goes: bench-kv's per-thread CPU accounting (Linux /proc only).

Contract: `thread_cpu_seconds(pid)` sums the CPU time (user + system) of one process's threads in
three groups: `main` (the thread whose id is the pid: the event loop that encodes, verifies and
decodes), `zmq` (ZeroMQ's I/O threads, `ZMQbg/IO/*`: the socket copies and the TCP stack) and
`other` (the rest: pyzmq's collector of zero-copy frames, a pipe reader). `run_cpu_accounting(
endpoints, peer_pid, sources, quantizer, chunk_bytes, transfers)` sends `transfers` transfers of each
of CPU_CASES back to back over loopback and returns, per (source, case), the wall time and each
group's CPU in both processes, per transfer; `print_cpu_accounting` prints them as a table.
Not a target. Why: on a machine with two cores the four busy threads of a transfer (each side's
event loop and ZeroMQ I/O thread) share them, so a transfer's wall time is bounded below by its
CPU time over two, and every CPU-millisecond a side spends shows up in the end-to-end ratios.
This table says how much each side adds above the plain-pyzmq sends of the same bytes, measured
by the kernel's accounting instead of by timestamps (which the contention itself distorts).
The clock-tick resolution (10 ms) is why each cell is an average over many transfers.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import zmq
import zmq.asyncio

from bus.kv import KVSender
from bus.kv.quant import Quantizer
from harness.bench.kv_baselines import (
    SEND_CONFIG,
    WINDOW,
    bare_frames,
    bare_send_seconds,
    chunked_send_seconds,
    raw_chunk_frames,
)

CPU_CASES = ["bare pyzmq", "chunked pyzmq", "raw+none", "int8+auto"]
GROUPS = ("main", "zmq", "other")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of `pid`'s threads, summed per group (GROUPS); {} where /proc is absent."""
    groups: dict[str, float] = defaultdict(float)
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            stat = (task / "stat").read_text()
        except OSError:   # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()   # fields 14 and 15 of proc(5), from field 3 on
        seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        group = "main" if task.name == str(pid) else "zmq" if name.startswith("ZMQbg/IO") else "other"
        groups[group] += seconds
    return dict(groups)


class _Sends:
    """One transfer of a CPU_CASES case: the plain-pyzmq baselines or pdbus's KVSender."""

    def __init__(self, endpoints: dict, quantizer: Quantizer, chunk_bytes: int) -> None:
        self.endpoint, self.chunk_bytes = endpoints["kv"], chunk_bytes
        self.sender = KVSender(quantizer=quantizer, chunk_bytes=chunk_bytes, config=SEND_CONFIG)
        context = zmq.asyncio.Context.instance()
        self.bare, self.checked = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        self.bare.connect(endpoints["bare"])
        self.checked.connect(endpoints["checked"])

    def use(self, name: str, source) -> None:
        self.name, self.source = name, source
        self.frames = bare_frames(source)
        self.chunks = raw_chunk_frames(source, self.chunk_bytes)

    async def send(self, case: str, number: int) -> None:
        if case == "bare pyzmq":
            await bare_send_seconds(self.bare, self.frames)
        elif case == "chunked pyzmq":
            await chunked_send_seconds(self.checked, self.chunks, WINDOW)
        else:
            mode, compression = case.split("+")
            await self.sender.send(self.endpoint, f"cpu-{self.name}-{case}-{number}", "bench", self.source,
                                   mode=mode, compression=compression)

    async def close(self) -> None:
        await self.sender.close()
        self.bare.close(linger=0)
        self.checked.close(linger=0)


async def run_cpu_accounting(endpoints: dict, peer_pid: int, sources: dict, quantizer: Quantizer,
                             chunk_bytes: int, transfers: int = 100) -> dict:
    """{(source, case): {"wall": s, "sender main": s, ..., "receiver other": s}} per transfer."""
    sends = _Sends(endpoints, quantizer, chunk_bytes)
    results = {}
    for name, source in sources.items():
        sends.use(name, source)
        for case in CPU_CASES:
            for number in range(5):   # warm-up: sockets, buffers, the receiver's pages
                await sends.send(case, -number - 1)
            before = (thread_cpu_seconds(os.getpid()), thread_cpu_seconds(peer_pid), time.perf_counter())
            for number in range(transfers):
                await sends.send(case, number)
            after = (thread_cpu_seconds(os.getpid()), thread_cpu_seconds(peer_pid), time.perf_counter())
            row = {"wall": (after[2] - before[2]) / transfers}
            for side, start, end in (("sender", before[0], after[0]), ("receiver", before[1], after[1])):
                for group in GROUPS:
                    row[f"{side} {group}"] = (end.get(group, 0.0) - start.get(group, 0.0)) / transfers
            results[name, case] = row
    await sends.close()
    return results


def print_cpu_accounting(results: dict, transfers: int) -> None:
    print(f"\n### CPU per transfer, per thread, both processes (loopback; {transfers} transfers a case back to "
          "back; not a target)\n\n"
          "ms per transfer from the kernel's accounting. main: the event loop (encode and checksum on the "
          "sender; verify, decode, answer on the receiver); ZeroMQ I/O: its I/O thread (socket copies, TCP); "
          "other: pyzmq's collector of zero-copy frames and the bench's pipe reader. With two cores, a "
          "transfer cannot take less wall time than its total CPU over two.\n")
    print("| source | case | wall ms | sender main | sender ZeroMQ I/O | sender other | receiver main "
          "| receiver ZeroMQ I/O | receiver other | CPU total | CPU / wall |\n|---|---|" + "---:|" * 9)
    for (name, case), row in results.items():
        cpu = sum(value for key, value in row.items() if key != "wall")
        cells = [row[f"{side} {group}"] * 1e3 for side in ("sender", "receiver") for group in GROUPS]
        print(f"| {name} | {case} | {row['wall'] * 1e3:.2f} | " + " | ".join(f"{c:.2f}" for c in cells)
              + f" | {cpu * 1e3:.2f} | {cpu / row['wall']:.2f} |")
