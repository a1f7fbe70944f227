"""The recovery timeline on hand-made processes and records: events in the window around the fault,
on the fault's clock, oldest first, capacity noise left out, and one entry per resumed stream."""

from __future__ import annotations

from types import SimpleNamespace

from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent
from harness.chaos.timeline import timeline


def proc(*events):
    return SimpleNamespace(events=[{"event": name, "seen_at": at, **fields} for name, at, fields in events])


def test_events_around_the_fault_and_the_resumed_streams_in_time_order():
    cluster = SimpleNamespace(
        nodes={"decode-1": proc(("request_done", 12.0, {"request_id": "r"}))},
        dead=[("decode-0", proc(("kv_arrived", 9.0, {"request_id": "old"})))],
        broker=proc(("node_left", 10.3, {"node_id": "decode-0", "reason": "connection_lost", "extra": 1}),
                    ("capacity_changed", 10.4, {})),
        old_brokers=[], gateway=proc(("access", 10.5, {})))
    hit = StreamRecord("r000", 5.0, token_times=[9.8, 11.5, 11.6], finished_at=13.0)
    hit.pdbus = {"failures": ["node_lost@decode-0"]}
    spared = StreamRecord("r001", 5.0, token_times=[9.8, 10.1], finished_at=13.0)
    entries = timeline(cluster, FaultEvent(10.0, "decode-0"), [hit, spared], before_s=0.5, after_s=2.5)
    assert [(e["t"], e["process"], e["event"]) for e in entries] == [
        (0.3, "broker", "node_left"), (1.5, "client", "stream_resumed"), (2.0, "decode-1", "request_done")]
    assert entries[0]["reason"] == "connection_lost" and "extra" not in entries[0]
    assert entries[1]["name"] == "r000" and entries[1]["failures"] == ["node_lost@decode-0"]


def test_no_fault_no_timeline():
    assert timeline(SimpleNamespace(), None, []) == []
