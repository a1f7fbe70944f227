"""HeapTrimmer: trims only after work ran and the node then stayed idle; never while busy; the
node's caches let go right before a trim."""

from __future__ import annotations

import sys

import pytest

from nodes.heap import HeapTrimmer, _glibc_trim, keep_freed_heap, use_mmap_above


def trimmer(idle_after_s: float = 0.2):
    calls = []
    return HeapTrimmer(idle_after_s, trim=lambda: calls.append(1)), calls


def test_a_node_that_never_worked_never_trims():
    heap, calls = trimmer()
    for step in range(20):
        heap.on_iteration(False, step * 0.1)
    assert calls == []


def test_it_trims_once_after_the_idle_delay_that_follows_work():
    heap, calls = trimmer(0.2)
    heap.on_iteration(True, 0.0)
    heap.on_iteration(False, 0.1)
    heap.on_iteration(False, 0.25)
    assert calls == []                      # idle for 0.15 s only
    assert heap.on_iteration(False, 0.31) >= 0.0   # trimmed: how long it took
    assert heap.on_iteration(False, 0.5) is None
    heap.on_iteration(False, 5.0)
    assert calls == [1] and heap.num_trims == 1


def test_caches_let_go_right_before_each_trim_and_only_then():
    order = []
    heap = HeapTrimmer(0.2, trim=lambda: order.append("trim"), before_trim=lambda: order.append("caches"))
    heap.on_iteration(True, 0.0)
    heap.on_iteration(False, 0.1)
    assert order == []
    heap.on_iteration(False, 0.35)
    heap.on_iteration(False, 1.0)
    assert order == ["caches", "trim"]


def test_work_in_between_restarts_the_idle_clock():
    heap, calls = trimmer(0.2)
    heap.on_iteration(True, 0.0)
    heap.on_iteration(False, 0.1)
    heap.on_iteration(True, 0.25)           # busy again before the delay ran out
    heap.on_iteration(False, 0.3)
    heap.on_iteration(False, 0.45)
    assert calls == []
    heap.on_iteration(False, 0.5)
    assert calls == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_real_trim_runs_here():
    trim = _glibc_trim()
    assert trim is not None
    trim()


def test_mmap_threshold_is_set_through_mallopt():
    calls = []
    assert use_mmap_above(4 << 20, mallopt=lambda param, value: calls.append((param, value)) or 1)
    assert calls == [(-3, 4 << 20)]                       # M_MMAP_THRESHOLD
    assert not use_mmap_above(1, mallopt=lambda param, value: 0)   # refused


def test_trim_threshold_is_set_through_mallopt():
    calls = []
    assert keep_freed_heap(256 << 20, mallopt=lambda param, value: calls.append((param, value)) or 1)
    assert calls == [(-1, 256 << 20)]                     # M_TRIM_THRESHOLD


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_decode_heap_keeps_freed_frames_until_the_trim():
    """In a child process: with a decode node's heap, 3 MiB blocks (below the mmap threshold, as
    received KV frames are) freed together stay resident for reuse, and the idle trim gives them back."""
    import subprocess
    code = (
        "import ctypes, re\n"
        "from nodes.heap import configure_decode_heap, _glibc_trim\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]\n"
        "rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "configure_decode_heap()\n"
        "before = rss()\n"
        "blocks = [libc.malloc(3 << 20) for _ in range(10)]\n"
        "for b in blocks: ctypes.memset(b, 1, 3 << 20)\n"
        "for b in blocks: libc.free(b)\n"
        "kept = rss()\n"
        "_glibc_trim()()\n"
        "after = rss()\n"
        "assert kept - before > 24 << 10 and after - before < 4 << 10, (before, kept, after)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_decode_heap_reuses_the_frames_of_whole_chunks_received_over_zeromq():
    """In a child process, over real sockets: a transfer's full-size chunks (a payload of
    DEFAULT_CHUNK_BYTES each, as a plane split by tokens sends), received and freed together, are
    received again into the same memory. With the mmap threshold at exactly 4 MiB
    glibc mapped each frame afresh, and ZeroMQ's I/O thread faulted in every page of it."""
    import subprocess
    code = (
        "import resource, numpy as np, zmq\n"
        "from bus.kv.layout import DEFAULT_CHUNK_BYTES\n"
        "from nodes.heap import configure_decode_heap\n"
        "configure_decode_heap()\n"
        "context = zmq.Context()\n"
        "server, client = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)\n"
        "client.connect('tcp://127.0.0.1:%d' % server.bind_to_random_port('tcp://127.0.0.1'))\n"
        "payload = np.ones(DEFAULT_CHUNK_BYTES, np.uint8)\n"
        "faults = []\n"
        "for _ in range(3):\n"
        "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "    kept = []\n"
        "    for _ in range(6):\n"
        "        client.send_multipart([b'header', payload], copy=False)\n"
        "        kept.append(server.recv_multipart(copy=False))\n"
        "    del kept\n"
        "    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
        "pages = 6 * DEFAULT_CHUNK_BYTES // 4096\n"
        "assert faults[-1] < pages // 10, (faults, pages)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_above_the_threshold_goes_back_to_the_os():
    """In a child process (the setting is process-wide): after the threshold, a 16 MiB buffer
    freed leaves the resident size where it was before it was touched."""
    import subprocess
    code = (
        "import numpy as np, re\n"
        "from nodes.heap import use_mmap_above\n"
        "rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "assert use_mmap_above(4 << 20)\n"
        "for _ in range(3):\n"   # the default threshold would rise after the first free
        "    a = np.ones(16 << 20, np.uint8); del a\n"
        "before = rss(); a = np.ones(16 << 20, np.uint8); during = rss(); del a; after = rss()\n"
        "assert during - before > 12 << 10 and after - before < 4 << 10, (before, during, after)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
