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


def test_idle_interval_defaults_to_one_second_or_the_interval_and_is_bounded():
    assert HeartbeatConfig().idle_interval_s == 1.0 and HeartbeatConfig().idle_expiry_s == 3.0
    assert HeartbeatConfig(interval_s=2.0).idle_interval_s == 2.0
    assert HeartbeatConfig.from_settings({"idle_interval_ms": 500}).idle_interval_s == 0.5
    for idle in (0.1, 61.0):   # below the interval, above the bound
        with pytest.raises(ValueError, match="idle interval"):
            HeartbeatConfig(0.25, 3, idle_interval_s=idle)


def test_an_idle_link_uses_the_idle_interval_and_window(clock):
    config = HeartbeatConfig(0.25, 3, idle_interval_s=1.0)
    timers = LinkTimers(clock.now, clock.now)
    timers.engage(False, clock.now)
    clock.advance(0.5)
    assert not timers.heartbeat_due(clock.now, config) and not timers.is_expired(clock.now, config)
    clock.advance(0.5)
    assert timers.heartbeat_due(clock.now, config)
    clock.advance(2.01)
    assert timers.is_expired(clock.now, config)


def test_an_engaged_link_counts_its_short_window_from_when_the_work_began(clock):
    config = HeartbeatConfig(0.25, 3, idle_interval_s=1.0)
    timers = LinkTimers(clock.now, clock.now)
    timers.engage(False, clock.now)
    clock.advance(2.0)   # idle silence, within the idle window
    timers.engage(True, clock.now)
    assert not timers.is_expired(clock.now, config) and timers.heartbeat_due(clock.now, config)
    clock.advance(0.1)
    timers.engage(True, clock.now)   # still engaged: the start does not move
    clock.advance(0.66)
    assert timers.is_expired(clock.now, config)
    timers.heard(clock.now)
    timers.engage(False, clock.now)
    assert timers.engaged_at is None and not timers.is_expired(clock.now + 2.9, config)
