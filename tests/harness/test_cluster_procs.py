"""harness.cluster_procs: ports for children to bind, and a node that dies before joining."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest

from harness import cluster_procs
from harness.cluster_procs import ClusterProcs, free_port


def test_free_ports_are_bindable_and_below_the_ephemeral_range():
    low = cluster_procs._ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low   # no connect() takes it as a source port meanwhile
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))


def test_when_every_probe_is_taken_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(cluster_procs, "_ephemeral_low", lambda: 1025)   # a range of one port, 1024
    with socket.socket() as holder:
        with contextlib.suppress(OSError):   # taken already, or not ours to take: the probe fails either way
            holder.bind(("127.0.0.1", 1024))
        assert free_port() > 1024


@pytest.mark.integration
def test_a_node_that_exits_before_joining_fails_the_start_at_once_with_its_own_log():
    started = time.monotonic()
    cluster = ClusterProcs(num_prefill=0, num_decode=1, settings={"engine": {"device": "gpu"}})
    with pytest.raises(AssertionError, match=r"(?s)decode-0 exited with 2 before joining.*unknown \[engine\] device"), \
            cluster:
        pass
    assert time.monotonic() - started < 60   # not the 120 s join timeout
