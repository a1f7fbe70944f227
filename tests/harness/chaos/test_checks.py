"""The shared chaos checks on hand-made records: comparison with the reference (ids or text),
percentiles, which streams a fault hit and their recovery time, and the KV fault audit."""

from __future__ import annotations

from harness.chaos.checks import (
    compare,
    first_divergence,
    kv_fault_audit,
    latency,
    percentile,
    recovery,
    resumed_at,
    rss_grown,
)
from harness.chaos.drivers import StreamRecord
from harness.chaos.passes import FaultEvent


def record(name, ids=None, text="", ok=True, started=0.0, finished=1.0, times=(), failures=(), count=None):
    r = StreamRecord(name, started, token_ids=list(ids) if ids is not None else None, texts=[text],
                     token_times=list(times), finished_at=finished, ok=ok)
    r.pdbus = {"failures": list(failures)}
    r.num_completion_tokens = count
    return r


def test_token_ids_are_compared_when_both_passes_have_them():
    reference = {"a": record("a", [1, 2, 3]), "b": record("b", [4, 5, 6])}
    result = compare([record("a", [1, 2, 3]), record("b", [4, 9, 6], failures=["node_lost@decode-0"])], reference)
    assert result.exact_ids and result.num_compared == 2 and result.num_identical == 1 and not result.identical
    assert result.diverged == [{"name": "b", "at": 1, "failed_over": True}]


def test_texts_and_token_counts_are_compared_without_ids():
    reference = {"a": record("a", text="hello", count=5), "b": record("b", text="hi", count=2)}
    result = compare([record("a", text="hello", count=5), record("b", text="hi", count=3)], reference)
    assert not result.exact_ids and result.num_identical == 1 and result.diverged[0]["at"] == -1


def test_a_lost_stream_is_not_compared_and_nothing_compared_is_not_identical():
    reference = {"a": record("a", [1])}
    assert compare([record("a", [2], ok=False)], reference).num_compared == 0
    assert not compare([], reference).identical


def test_first_divergence_finds_the_index_or_the_shorter_length():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_percentiles_and_latency_use_finished_streams_only():
    assert percentile([], 50) is None and percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 9.0], 99) == 9.0
    lat = latency([record("a", finished=2.0), record("b", ok=False, finished=50.0)])
    assert lat == {"p50_s": 2.0, "p99_s": 2.0}


def test_recovery_counts_only_live_streams_that_the_fault_hit():
    fault = FaultEvent(at=10.0, target="decode-0")
    hit = record("a", started=9.0, finished=13.0, times=[9.5, 11.2, 11.3], failures=["node_lost@decode-0"])
    untouched = record("b", started=9.0, finished=12.0, times=[9.5, 10.1])
    done_before = record("c", started=1.0, finished=5.0, times=[2.0], failures=["x"])
    assert [round(t, 3) for t in recovery([hit, untouched, done_before], fault)] == [1.2]
    broker = FaultEvent(at=10.0, target="broker")
    assert [round(t, 3) for t in recovery([untouched], broker)] == [0.1]
    assert recovery([hit], None) == []


def test_the_resumed_token_ends_the_longest_silence_after_the_fault():
    # two tokens trickle in from buffers right after a cut, then the stream stalls until failover
    assert resumed_at([9.0, 10.01, 10.02, 11.5, 11.55], 10.0) == 11.5
    assert resumed_at([9.0, 9.5], 10.0) is None


class FakeProc:
    def __init__(self, events):
        self.events = events


class FakeCluster:
    def __init__(self, events):
        self.procs = [FakeProc(events)]

    def processes(self, role=None):
        return self.procs


def test_kv_audit_flags_a_verified_transfer_with_fewer_catches_than_flips():
    flip = {"event": "chaos_kv_fault", "kind": "flip"}
    events = [{**flip, "transfer_id": "t1"}, {**flip, "transfer_id": "t1"}, {**flip, "transfer_id": "t2"},
              {**flip, "transfer_id": "t3"},
              {"event": "kv_received", "transfer_id": "t1", "ok": True, "checksum_failures": 2, "rejected": 0},
              {"event": "kv_receive_failed", "transfer_id": "t2", "ok": False, "checksum_failures": 0, "rejected": 0},
              {"event": "kv_received", "transfer_id": "t3", "ok": True, "checksum_failures": 0, "rejected": 0}]
    audit = kv_fault_audit(FakeCluster(events))
    assert audit == {"transfers_with_flips": 3, "failed_closed": 1, "verified_after_resend": 2,
                     "undecodable_headers": 0, "uncaught_flips": 1}
    audit = kv_fault_audit(FakeCluster([*events, {"event": "kv_undecodable"}]))
    assert audit["uncaught_flips"] == 0


def test_rss_growth_past_the_slack_is_reported_per_surviving_node():
    before = {"decode-0": (10, 1000.0), "decode-1": (11, 1000.0), "prefill-0": (12, 100.0), "gone": (13, 50.0)}
    after = {"decode-0": (10, 1090.0), "decode-1": (21, 400.0), "prefill-0": (12, 300.0)}
    # decode-0 within max(64, 10% = 100); decode-1 is a revived process (new pid); gone is gone
    assert rss_grown(before, after, slack_mib=64, slack_ratio=0.10) == {"prefill-0": 200.0}
    assert rss_grown(before, {"decode-0": (10, 1101.0)}, slack_mib=64, slack_ratio=0.10) == {"decode-0": 101.0}


def test_memory_a_decode_node_holds_by_design_for_cached_sessions_is_allowed():
    before, after = {"decode-0": (10, 1000.0)}, {"decode-0": (10, 1250.0)}
    assert rss_grown(before, after, slack_mib=128, slack_ratio=0.10) == {"decode-0": 250.0}
    assert rss_grown(before, after, slack_mib=128, slack_ratio=0.10, held_mib={"decode-0": 200.0}) == {}
    assert rss_grown(before, after, 128, 0.10, held_mib={"decode-0": -500.0}) == {"decode-0": 250.0}   # evicted: no credit
