"""The lending rule as plain data (nodes/lending.py): its guards, its comparison of the two queues,
and the validation of its `[decode] lend_*` settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.config_file import SettingsError
from nodes.lending import LendSettings

ON = LendSettings(prefill_tokens=2048, max_running=8, min_backlog_tokens=1, margin=1.4)


def lends(settings=ON, *, prompt=500, backlog=1000, own=0, running=0):
    return settings.lends(num_prompt_tokens=prompt, backlog_tokens=backlog, own_queue_tokens=own,
                          num_requests=running)


@pytest.mark.parametrize("case, expected", [
    ({}, True),                                   # 1.4 x 500 = 700 < 1500
    ({"backlog": 0}, False),                      # the prefill node is idle
    ({"backlog": 200}, False),                    # 700 >= 700: a tie goes to the prefill node
    ({"backlog": 201}, True),
    ({"own": 600}, False),                        # 1.4 x 1100 = 1540 >= 1500: this queue is longer
    ({"own": 500}, True),                         # 1400 < 1500
    ({"running": 8}, False),                      # the bound on what lending costs the streams
    ({"prompt": 2049, "backlog": 10_000}, False),  # past lend_prefill_tokens
    ({"prompt": 0}, False),
])
def test_it_lends_when_this_node_would_finish_the_prompt_sooner(case, expected):
    assert lends(**case) is expected


def test_off_by_default_and_margin_zero_drops_the_comparison():
    assert not lends(LendSettings())
    no_comparison = LendSettings(prefill_tokens=2048, max_running=8, min_backlog_tokens=1, margin=0)
    assert lends(no_comparison, backlog=1, own=100_000)
    assert not lends(no_comparison, backlog=0)


amounts = st.integers(0, 100_000)


@given(settings=st.builds(LendSettings, prefill_tokens=amounts, max_running=st.integers(0, 64),
                          min_backlog_tokens=amounts, margin=st.floats(0, 100)),
       prompt=amounts, backlog=amounts, own=amounts, running=st.integers(0, 64), more=st.integers(1, 10_000))
def test_a_longer_backlog_never_stops_a_loan_and_a_longer_own_queue_never_starts_one(
        settings, prompt, backlog, own, running, more):
    lent = lends(settings, prompt=prompt, backlog=backlog, own=own, running=running)
    if lent:
        assert lends(settings, prompt=prompt, backlog=backlog + more, own=own, running=running)
        assert 0 < prompt <= settings.prefill_tokens and running < settings.max_running
        assert backlog >= settings.min_backlog_tokens
    else:
        assert not lends(settings, prompt=prompt, backlog=backlog, own=own + more, running=running)


def test_settings_come_from_the_decode_section():
    got = LendSettings.from_section({"lend_prefill_tokens": 1024, "lend_max_running": 4,
                                     "lend_min_backlog_tokens": 16, "lend_margin": 2})
    assert got == LendSettings(1024, 4, 16, 2.0)
    assert LendSettings.from_section({}) == LendSettings()


@pytest.mark.parametrize("key, value", [
    ("lend_prefill_tokens", -1), ("lend_max_running", 1.5), ("lend_min_backlog_tokens", True),
    ("lend_margin", -0.1), ("lend_margin", 101), ("lend_margin", "1.4"), ("lend_margin", False),
    ("lend_margin", float("nan")),
])
def test_a_bad_lend_setting_is_refused_by_name(key, value):
    with pytest.raises(SettingsError, match=key):
        LendSettings.from_section({key: value})
