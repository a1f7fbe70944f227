"""bus.liveness: heartbeat settings, link timers and the reconnect back-off."""

from __future__ import annotations

import random

import pytest

from bus.liveness import Backoff, HeartbeatConfig, LinkTimers


def test_defaults_detect_a_dead_peer_in_under_a_second():
    config = HeartbeatConfig()
    assert config.expiry_s + config.tick_s < 1.0


def test_from_settings_reads_milliseconds():
    config = HeartbeatConfig.from_settings({"interval_ms": 100, "liveness": 5, "backoff_cap_ms": 2000})
    assert (config.interval_s, config.liveness, config.backoff_cap_s) == (0.1, 5, 2.0)
    assert HeartbeatConfig.from_settings({}) == HeartbeatConfig()


@pytest.mark.parametrize("interval, liveness", [(0, 3), (0.25, 0)])
def test_invalid_settings_are_refused(interval, liveness):
    with pytest.raises(ValueError):
        HeartbeatConfig(interval, liveness)


def test_link_timers(clock):
    config = HeartbeatConfig(0.25, 3)
    timers = LinkTimers(clock.now, clock.now)
    clock.advance(0.25)
    assert timers.heartbeat_due(clock.now, config) and not timers.is_expired(clock.now, config)
    timers.sent(clock.now)
    assert not timers.heartbeat_due(clock.now, config)
    clock.advance(0.51)
    assert timers.is_expired(clock.now, config)
    timers.heard(clock.now)
    assert not timers.is_expired(clock.now, config)


def test_backoff_doubles_with_jitter_up_to_the_cap_and_resets():
    backoff = Backoff(0.25, 2.0, random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [min(2.0, 0.25 * 2 ** i) for i in range(8)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    backoff.reset()
    assert backoff.next_delay() <= 0.25
