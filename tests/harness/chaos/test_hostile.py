"""The `hostile-peer` scenario's plumbing: its registration, what the hostile process keeps out
(what plain mode admits by design), the live ids it is fed from the nodes' logs, its evidence
check, and the process itself against a real broker and a bare KV endpoint."""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import SimpleNamespace

import zmq

from bus import codec
from bus.constants import Command
from bus.messages import CapacityUpdate, Final, Ready, Request
from harness.chaos import hostile_scenario
from harness.chaos.hostile import harmless
from harness.chaos.passes import FaultEvent
from harness.chaos.scenarios import SCENARIOS
from harness.cluster_procs import ClusterProcs, Proc, free_port


def test_the_scenario_is_registered_with_its_hooks_and_no_recovery_bound():
    scenario = SCENARIOS["hostile-peer"]
    assert scenario.inject is hostile_scenario.inject and scenario.repair is hostile_scenario.repair
    assert scenario.check is hostile_scenario.check and not scenario.recovery_bound and scenario.extras is None


def test_harmless_keeps_out_serving_registrations_attractive_capacity_and_real_work():
    def frames(message):
        return codec.encode(message)
    assert not harmless("READY", frames(Ready("decode", "ghost")), registered=False)
    assert harmless("READY", frames(Ready("gateway", "ghost")), registered=False)
    assert not harmless("READY", frames(Ready("gateway", "ghost")), registered=True)   # the session stays itself
    assert harmless("READY", [codec.HEADERS[Command.READY], b"\xc1"], registered=True)  # malformed: refused anyway
    assert not harmless("REQUEST", frames(Request("decode", "r1", {})), registered=True)
    assert harmless("REQUEST", frames(Request("nope", "r1", {})), registered=True)
    assert not harmless("CAPACITY", frames(CapacityUpdate({"full": 0})), registered=True)
    assert harmless("CAPACITY", frames(CapacityUpdate({"full": 0})), registered=False)   # not_registered
    assert harmless("FINAL", frames(Final("r1", 0, {})), registered=True)


class FakeProc:
    def __init__(self, events, pid=1, alive=True):
        self.events, self.alive = events, alive
        self.process = SimpleNamespace(pid=pid)

    def find(self, name, **fields):
        return [e for e in self.events if e.get("event") == name]


def test_live_ids_come_from_the_nodes_logs_most_recent_last():
    decode = FakeProc([{"event": "kv_received", "request_id": "r2", "transfer_id": "t2", "seen_at": 2.0},
                       {"event": "kv_arrived", "request_id": "r3", "transfer_id": "t3", "seen_at": 3.0},
                       {"event": "request_done", "request_id": "ignored", "seen_at": 4.0}])
    prefill = FakeProc([{"event": "prefill_done", "request_id": "p1", "decode_request_id": "r1", "seen_at": 1.0}])
    cluster = SimpleNamespace(processes=lambda: [decode, prefill])
    assert hostile_scenario.live_ids(cluster) == {"request_ids": ["r1", "r2", "r3"], "transfer_ids": ["t2", "t3"]}


def test_the_check_wants_every_family_live_forgeries_refusals_and_the_same_processes():
    broker = FakeProc([{"event": "message_rejected"}] * 3, pid=10)
    cluster = SimpleNamespace(broker=broker, gateway=FakeProc([], pid=11), nodes={"decode-0": FakeProc([], pid=12)})
    counts = {"sent.broker.garbage": 5, "sent.session.gateway.DIRECT.live": 2, "sent.kv.CHUNK": 4,
              "forged.live.DIRECT": 2}
    ctx = SimpleNamespace(cluster=cluster, fault=FaultEvent(0.0, "hostile-peer", {"counts": counts}))
    hostile_scenario._RUNNING[id(ctx)] = {"pids": hostile_scenario.pids(cluster), "rejected_before": 1}
    evidence = hostile_scenario.check(ctx, {}, {})
    assert evidence["ok"] and evidence["broker_rejected"] == 2 and evidence["forged_at_live_requests"] == 2
    hostile_scenario._RUNNING[id(ctx)] = {"pids": {**hostile_scenario.pids(cluster), "decode-0": 99}, "rejected_before": 1}
    evidence = hostile_scenario.check(ctx, {}, {})
    assert not evidence["ok"] and evidence["survived"]["decode-0"] is False


def count_messages(socket: zmq.Socket, received: list, stop: threading.Event) -> None:
    while not stop.is_set():
        if socket.poll(50):
            received.append(socket.recv_multipart())


def test_the_hostile_process_speaks_every_family_then_stops_on_sigterm(tmp_path):
    kv_port = free_port()
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{kv_port}")
    received, stop = [], threading.Event()
    reader = threading.Thread(target=count_messages, args=(router, received, stop), daemon=True)
    reader.start()
    (tmp_path / "ids.json").write_text(json.dumps({"request_ids": ["r-live"], "transfer_ids": ["t-live"]}))
    with ClusterProcs(num_prefill=0, num_decode=0) as cluster:
        hostile = Proc([sys.executable, "-m", "harness.chaos.hostile", "--broker", cluster.broker_endpoint,
                        "--kv", f"tcp://127.0.0.1:{kv_port}", "--node", "decode-0", "--ids", str(tmp_path / "ids.json"),
                        "--summary", str(tmp_path / "summary.json"), "--rate", "3000", "--seconds", "30"])
        cluster.broker.wait_for("node_joined", timeout=30, node_id="hostile-gateway")
        cluster.broker.wait_for("message_rejected", timeout=30, count=20)
        hostile.signal(signal.SIGTERM)
        assert hostile.wait_exit(20) == 0
        assert cluster.broker.alive
    stop.set()
    reader.join(2)
    router.close(linger=0)
    counts = json.loads((tmp_path / "summary.json").read_text())
    for family in ("sent.broker.", "sent.session.gateway.", "sent.session.decode.", "sent.kv."):
        assert any(k.startswith(family) for k in counts), family
    assert counts.get("forged.live.DIRECT", 0) > 0 and counts.get("forged.live.CANCEL", 0) > 0
    assert counts.get("forged.live.KV_CHUNK", 0) > 0 and len(received) > 0
