"""/dashboard in a real browser on a real cluster (tiny model: a broker, 1 prefill and 2 decode
nodes, a gateway with an API key): under load, headless Chromium opens `/dashboard?api_key=…`, the
page takes the key out of its address bar, its event stream draws the nodes and charts with data
and the KV transfers; a decode node killed mid-load shows as lost, with the failover it caused.
Skipped where there is no Chromium (`apt-get install -y chromium`, or PDBUS_CHROMIUM)."""

from __future__ import annotations

import json

import pytest

from harness.dashboard_browser import (
    CHARTS_FILLED_JS,
    STATE_JS,
    Load,
    fail_over,
    failover_shown_js,
    open_dashboard,
)
from harness.headless_chromium import Chromium, find_chromium
from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_chromium() is None, reason="no Chromium: apt-get install -y chromium "
                                 "(Debian's package, /usr/bin/chromium) or set PDBUS_CHROMIUM")]
KEY = "sk-dashboard-browser-test"
PACED = {"decode": ["--test-step-delay-ms", "10"]}   # the tiny model's streams last long enough to kill one


def state(tab) -> dict:
    return tab.evaluate(STATE_JS)


def test_the_dashboard_shows_the_cluster_under_load_and_a_failover():
    with gateway_cluster(num_decode=2, extra_args=PACED, gateway={"api_keys": [KEY]}) as (cluster, gateway), \
            Load(gateway.url, TINY_NAME, concurrency=3, api_key=KEY) as load, Chromium() as browser:
        tab = open_dashboard(browser, f"{gateway.url}/dashboard?api_key={KEY}")
        assert tab.evaluate("location.search") == ""   # the key left the address bar
        tab.wait_for(CHARTS_FILLED_JS, timeout_s=15)
        seen = state(tab)
        assert seen["status"] == "connected", seen
        assert seen["nodes"] == [["decode-0", "decode", "live"], ["decode-1", "decode", "live"],
                                 ["prefill-0", "prefill", "live"]], seen
        assert seen["transfers"] > 0 and seen["charts"]["chart-kv"][1] > 0, seen

        info = fail_over(gateway.url, TINY_NAME, cluster.kill, api_key=KEY)
        tab.wait_for(failover_shown_js(info["decode_nodes"][0]), timeout_s=15)
        assert load.num_done > 0, json.dumps(state(tab))
    assert load.num_failed == 0   # the load's streams on the killed node failed over too
