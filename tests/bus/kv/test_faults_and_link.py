"""The fault injector (chaos hook) and the shaped-link model."""

from __future__ import annotations

import pytest

from bus.kv.faults import FaultInjector
from bus.kv.frames import CHUNK, Ack, encode_message
from bus.kv.link import LinkShaper, gbit

CHUNK_FRAMES = [b"PDKV\x01\x01" + b"h" * 20, b"payload" * 10]
ACK_FRAMES = encode_message(Ack("t1", 0))


def test_off_by_default_and_passes_everything():
    faults = FaultInjector()
    assert all(faults.apply(CHUNK_FRAMES) is CHUNK_FRAMES for _ in range(100))
    assert faults.num_faults == 0


def test_flips_copy_the_frame_and_leave_the_original_intact():
    original = [bytes(f) for f in CHUNK_FRAMES]
    faults = FaultInjector(flip_probability=1.0, seed=3)
    flipped = faults.apply(CHUNK_FRAMES)
    assert flipped != CHUNK_FRAMES and original == CHUNK_FRAMES
    differing = sum(bin(a ^ b).count("1") for f, g in zip(flipped, original, strict=False) for a, b in zip(f, g, strict=False))
    assert differing == 1 and faults.flips == 1


def test_drops_are_seeded_and_replayable():
    def run():
        faults = FaultInjector(drop_probability=0.3, flip_probability=0.3, seed=7)
        return [faults.apply(CHUNK_FRAMES) for _ in range(50)]
    assert run() == run()
    faults = FaultInjector(drop_probability=0.5, seed=7)
    outcomes = [faults.apply(CHUNK_FRAMES) is None for _ in range(200)]
    assert 60 < sum(outcomes) < 140 and faults.drops == sum(outcomes)


def test_only_kinds_and_max_faults_limit_the_damage():
    faults = FaultInjector(drop_probability=1.0, only_kinds=(CHUNK,), max_faults=2)
    assert faults.apply(ACK_FRAMES) is ACK_FRAMES
    assert [faults.apply(CHUNK_FRAMES) for _ in range(3)][:2] == [None, None]
    assert faults.apply(CHUNK_FRAMES) is CHUNK_FRAMES and faults.num_faults == 2


def test_the_link_queues_messages_at_its_rate():
    link = LinkShaper(gbit(8))                 # 1e9 bytes/s
    assert link.release_time(1_000_000, 0.0) == pytest.approx(0.001)
    assert link.release_time(1_000_000, 0.0) == pytest.approx(0.002)   # queued behind the first
    assert link.release_time(1_000, 5.0) == pytest.approx(5.000001)    # idle link: no queue
    with pytest.raises(ValueError):
        LinkShaper(0)

