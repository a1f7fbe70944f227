"""SLO signals from the gateway's `/metrics`: histograms read from Prometheus text, p90 of a window
from bucket deltas (as `histogram_quantile`), a scraper that never raises, its wiring into the
planner's shell, `[planner]` keys and `pdbus cluster --planner` pointing it at its own gateway."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from nodes.commands import cluster_cmd
from nodes.config_file import SettingsError
from nodes.gateway.gateway_metrics import GatewayMetrics
from nodes.planner.planner_run import planner_options, serve_planner
from nodes.planner.planner_shell import PlannerShell
from nodes.planner.slo_signals import (
    TPOT,
    TTFT,
    SloSignals,
    fetch_text,
    gateway_metrics_url,
    histogram,
    window_fraction_within,
    window_quantile,
)
from scheduler.planner import DecisionKind, Planner
from scheduler.planner_config import PlannerConfig
from scheduler.planner_signals import ArrivalCount, Signals
from tests.conftest import FakeClock
from tests.nodes.planner.planner_fakes import FakeActuator, FakeEndpoint
from tests.scheduler.planner_helpers import decode_cap, pools, prefill_cap

BOUNDS = (0.5, 1.0, 2.5, math.inf)


def text_of(name: str, counts: tuple[float, ...]) -> str:
    """Prometheus text of one unlabelled histogram with cumulative `counts` over BOUNDS."""
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{"+Inf" if math.isinf(b) else b}"}} {c}' for b, c in zip(BOUNDS, counts, strict=True)]
    return "\n".join([*lines, f"{name}_count {counts[-1]}", f"{name}_sum 1.0"]) + "\n"


def test_the_gateways_own_histograms_are_read():
    metrics = GatewayMetrics()
    for seconds in (0.2, 0.3, 4.0):
        metrics.ttft.observe(seconds)
    text = metrics.render()[0].decode()
    ttft = histogram(text, TTFT)
    assert ttft is not None and ttft[0.25] == 1 and ttft[0.5] == 2 and ttft[math.inf] == 3
    assert histogram(text, TPOT)[math.inf] == 0          # present, nothing observed
    assert histogram("pdbus_other_bucket{le=\"+Inf\"} 1\nnot a line\n", TTFT) is None


def test_unreadable_lines_are_skipped():
    text = f'{TTFT}_bucket{{le="x"}} 1\n{TTFT}_bucket{{le="1.0"}} nan\n' + text_of(TTFT, (1, 2, 3, 4))
    assert histogram(text, TTFT) == dict(zip(BOUNDS, (1, 2, 3, 4), strict=True))


def test_the_p90_of_a_window_interpolates_inside_its_bucket():
    old = dict(zip(BOUNDS, (10, 10, 10, 10), strict=True))
    new = dict(zip(BOUNDS, (10, 15, 20, 20), strict=True))    # 5 in (0.5, 1], 5 in (1, 2.5]
    assert window_quantile(old, new, 0.9) == pytest.approx(1.0 + 1.5 * 4 / 5)
    assert window_quantile(old, new, 0.5) == pytest.approx(1.0)
    first = dict(zip(BOUNDS, (4, 4, 4, 4), strict=True))       # all in the first bucket: from 0
    assert window_quantile(None, first, 0.5) == pytest.approx(0.25)


def test_the_inf_bucket_gives_the_highest_finite_bound():
    old = dict(zip(BOUNDS, (0, 0, 0, 0), strict=True))
    assert window_quantile(old, dict(zip(BOUNDS, (0, 0, 0, 3), strict=True)), 0.9) == 2.5


def test_no_observations_in_the_window_is_unknown():
    same = dict(zip(BOUNDS, (1, 2, 3, 4), strict=True))
    assert window_quantile(same, same, 0.9) is None


def test_a_gateway_restart_takes_the_new_counts_alone():
    old = dict(zip(BOUNDS, (100, 100, 100, 100), strict=True))
    new = dict(zip(BOUNDS, (0, 0, 2, 2), strict=True))
    assert window_quantile(old, new, 0.5) == pytest.approx(1.75)


def test_the_share_within_a_limit_interpolates_inside_its_bucket():
    old = dict(zip(BOUNDS, (10, 10, 10, 10), strict=True))
    new = dict(zip(BOUNDS, (10, 15, 20, 20), strict=True))    # 5 in (0.5, 1], 5 in (1, 2.5]
    assert window_fraction_within(old, new, 1.0) == pytest.approx(0.5)
    assert window_fraction_within(old, new, 2.0) == pytest.approx((5 + 5 * 1.0 / 1.5) / 10)
    assert window_fraction_within(old, new, 0.25) == 0.0
    assert window_fraction_within(old, new, 99.0) == 1.0
    slow = dict(zip(BOUNDS, (10, 10, 10, 14), strict=True))   # 4 past the highest finite bound
    assert window_fraction_within(old, slow, 99.0) == 0.0
    assert window_fraction_within(old, old, 1.0) is None


@given(st.lists(st.integers(0, 50), min_size=4, max_size=4), st.floats(0, 200, allow_nan=False))
def test_the_share_within_a_limit_is_a_fraction_that_grows_with_the_limit(increments, limit):
    counts = tuple(itertools.accumulate(increments))
    new = dict(zip(BOUNDS, counts, strict=True))
    share = window_fraction_within(None, new, limit)
    if counts[-1] == 0:
        assert share is None
        return
    assert 0.0 <= share <= 1.0
    assert share <= window_fraction_within(None, new, limit + 0.5) + 1e-12


class FakeGateway:
    """`fetch` answering with cumulative TTFT/TPOT histograms the test moves on; None = down."""

    def __init__(self) -> None:
        self.ttft, self.tpot, self.down, self.calls = [0, 0, 0, 0], [0, 0, 0, 0], False, 0
        self.arrivals: str | None = '{"now": 100.0, "seconds": [[98, 2, 1, 0]]}'   # None: no such route

    def observe(self, which: list, bucket: int, n: int = 1) -> None:
        for index in range(bucket, len(which)):
            which[index] += n

    def fetch(self, url: str, timeout_s: float) -> str | None:
        self.calls += 1
        assert timeout_s > 0
        if url.startswith("http://gw/slo/arrivals?"):
            return None if self.down else self.arrivals
        assert url == "http://gw/metrics"
        return None if self.down else text_of(TTFT, tuple(self.ttft)) + text_of(TPOT, tuple(self.tpot))


def test_signals_cover_the_last_window_only():
    clock, gateway = FakeClock(), FakeGateway()
    signals = SloSignals("http://gw/metrics", window_s=10, clock=clock, fetch=gateway.fetch)
    gateway.observe(gateway.ttft, 3, 50)                       # before the first scrape: ignored
    assert signals() == Signals()                             # one scrape is no window
    for _ in range(10):
        clock.advance(1)
        gateway.observe(gateway.ttft, 0)
        gateway.observe(gateway.tpot, 1)
        got = signals()
    assert got.ttft_p90_s == pytest.approx(0.45) and 0.5 < got.tpot_p90_s <= 1.0
    for _ in range(11):                                        # a window later: only slow requests
        clock.advance(1)
        gateway.observe(gateway.ttft, 2)
        got = signals()
    assert 1.0 < got.ttft_p90_s <= 2.5 and got.tpot_p90_s is None
    assert len(signals.scrapes) <= 12


def test_with_targets_the_attainment_is_the_product_of_the_shares_within_them():
    clock, gateway = FakeClock(), FakeGateway()
    signals = SloSignals("http://gw/metrics", window_s=10, clock=clock, fetch=gateway.fetch, targets=(1.0, 0.5))
    signals()
    clock.advance(1)
    gateway.observe(gateway.ttft, 0, 3)     # 3 of 4 TTFTs <= 0.5 s: within 1 s
    gateway.observe(gateway.ttft, 2, 1)     # one in (1, 2.5]: over
    gateway.observe(gateway.tpot, 0, 4)     # every TPOT within 0.5 s
    assert signals().slo_attainment == pytest.approx(0.75)
    clock.advance(1)
    gateway.observe(gateway.tpot, 3, 4)     # 4 more TPOTs past 2.5 s: half of the window's TPOTs over
    assert signals().slo_attainment == pytest.approx(0.75 * 0.5)
    untargeted = SloSignals("http://gw/metrics", clock=clock, fetch=gateway.fetch)
    untargeted()
    clock.advance(1)
    gateway.observe(gateway.ttft, 0, 1)
    assert untargeted().slo_attainment is None


def test_with_targets_the_signals_carry_outcomes_by_arrival_from_the_first_scrape():
    clock, gateway = FakeClock(), FakeGateway()
    signals = SloSignals("http://gw/metrics", clock=clock, fetch=gateway.fetch, targets=(1.0, 0.5))
    first = signals()
    assert first.slo_attainment is None and first.arrivals == (ArrivalCount(clock() - 2.0, 2, 1, 2.0),)
    assert SloSignals("http://gw/metrics", clock=clock, fetch=gateway.fetch)().arrivals is None   # no targets


def test_a_gateway_without_the_arrivals_route_still_gives_its_windows_logged_once():
    clock, gateway = FakeClock(), FakeGateway()
    gateway.arrivals = None
    signals = SloSignals("http://gw/metrics", window_s=10, clock=clock, fetch=gateway.fetch, targets=(1.0, 0.5))
    with capture_logs() as events:
        signals()
        clock.advance(1)
        gateway.observe(gateway.ttft, 0, 4)
        got = signals()
    assert got.arrivals is None and got.slo_attainment == pytest.approx(1.0)
    assert [e["event"] for e in events] == ["planner_slo_arrivals_unavailable"]


def test_a_gateway_that_does_not_answer_gives_unknown_signals_logged_once():
    clock, gateway = FakeClock(), FakeGateway()
    signals = SloSignals("http://gw/metrics", clock=clock, fetch=gateway.fetch)
    gateway.down = True
    with capture_logs() as events:
        assert signals() == Signals() and signals() == Signals()
    assert [e["event"] for e in events] == ["planner_slo_unavailable"]


def test_the_two_routes_are_fetched_at_once_so_a_silent_gateway_costs_one_timeout():
    """Each fetch waits for the other to be in flight too: fetched one after the other, both would
    time out at the barrier and the round would know nothing."""
    clock, gateway = FakeClock(), FakeGateway()
    both_in_flight = threading.Barrier(2, timeout=5)

    def fetch(url: str, timeout_s: float) -> str | None:
        try:
            both_in_flight.wait()
        except threading.BrokenBarrierError:
            return None
        return gateway.fetch(url, timeout_s)
    got = SloSignals("http://gw/metrics", clock=clock, fetch=fetch, targets=(1.0, 0.5))()
    assert got.arrivals == (ArrivalCount(clock() - 2.0, 2, 1, 2.0),)
    assert not both_in_flight.broken


def test_a_bug_in_reading_costs_the_signals_not_the_round():
    def broken(url: str, timeout_s: float) -> str:
        raise RuntimeError("boom")
    with capture_logs():
        assert SloSignals("http://gw/metrics", fetch=broken)() == Signals()


def test_fetch_never_raises():
    assert fetch_text("http://127.0.0.1:9/metrics", 0.5) is None
    assert fetch_text("not a url", 0.5) is None


def test_the_shell_feeds_the_signals_into_the_planner():
    config = PlannerConfig(sustain_s=0, cooldown_s=0, interval_s=0.01, max_nodes=2, min_prefill=0,
                           max_decode=2, tpot_p90_target_s=0.05)
    body = pools([prefill_cap(0, switchable=1)], [decode_cap(1)])
    endpoint = FakeEndpoint([body])
    called_on = []

    def signals() -> Signals:
        called_on.append(threading.current_thread() is threading.main_thread())
        return Signals(tpot_p90_s=0.2)

    shell = PlannerShell(Planner(config), endpoint, FakeActuator(), clock=FakeClock(), signals=signals)
    decision, = asyncio.run(shell.tick())
    assert (decision.kind, decision.role, decision.node_id) == (DecisionKind.SWITCH_ROLE, "decode", "prefill-0")
    assert "TPOT p90 0.200s > 0.05s" in decision.reason and called_on == [False]   # off the loop


def test_planner_keys_for_the_signals():
    options = planner_options({"planner": {"gateway_metrics_url": "http://h:1/metrics", "slo_window_s": 10}})
    assert (options.gateway_metrics_url, options.slo_window_s) == ("http://h:1/metrics", 10.0)
    assert planner_options({}).gateway_metrics_url is None
    assert planner_options({"planner": {"gateway_metrics_url": ""}}).gateway_metrics_url == ""
    for bad in ({"gateway_metrics_url": "h:1"}, {"gateway_metrics_url": 3}, {"slo_window_s": 0}):
        with pytest.raises(SettingsError):
            planner_options({"planner": bad})


def test_serve_planner_attaches_the_signals_to_a_shell_without_its_own():
    options = planner_options({"planner": {"gateway_metrics_url": "http://127.0.0.1:9/metrics"}})
    shell = PlannerShell(Planner(options.config), FakeEndpoint([{}]), FakeActuator(), clock=FakeClock())
    stop = asyncio.Event()
    stop.set()
    with capture_logs():
        asyncio.run(serve_planner(shell, options, stop))
    assert isinstance(shell.signals, SloSignals) and shell.signals.url == "http://127.0.0.1:9/metrics"
    assert shell.signals.targets == (options.config.ttft_p90_target_s, options.config.tpot_p90_target_s)
    bare = PlannerShell(Planner(), FakeEndpoint([{}]), FakeActuator(), clock=FakeClock())
    with capture_logs():
        asyncio.run(serve_planner(bare, planner_options({}), stop))
    assert bare.signals is Signals


@pytest.mark.parametrize(("gateway", "workers", "url"), [
    ({}, None, "http://127.0.0.1:8000/metrics"),
    ({"host": "0.0.0.0", "port": 9001}, None, "http://127.0.0.1:9001/metrics"),
    ({"host": "::1", "port": 9001, "tls_cert": "c.pem"}, None, "https://[::1]:9001/metrics"),
    ({"port": 0}, None, None),
    ({"workers": 2}, None, None),
    ({"workers": 2}, 1, "http://127.0.0.1:8000/metrics"),
])
def test_the_clusters_own_gateway_url(gateway, workers, url):
    assert gateway_metrics_url({"gateway": gateway}, workers) == url


def cluster_args(**flags) -> argparse.Namespace:
    values = {"prefill": 1, "decode": 1, "colocated": False, "nodes": None, "idle": False, "model": None,
              "no_gateway": False, "gateway_workers": None, "brokers": None} | flags
    return argparse.Namespace(**values)


def test_cluster_planner_reads_its_own_gateway_unless_told_otherwise():
    settings = {"gateway": {"port": 8123}}
    planner = cluster_cmd._planner(settings, cluster_cmd.cluster_shape(settings, cluster_args()), ())
    assert planner.options.gateway_metrics_url == "http://127.0.0.1:8123/metrics"
    off = {"gateway": {"port": 8123}, "planner": {"gateway_metrics_url": ""}}
    assert cluster_cmd._planner(off, cluster_cmd.cluster_shape(off, cluster_args()), ()).options.gateway_metrics_url == ""
    shape = cluster_cmd.cluster_shape(settings, cluster_args(no_gateway=True))
    assert cluster_cmd._planner(settings, shape, ()).options.gateway_metrics_url is None
