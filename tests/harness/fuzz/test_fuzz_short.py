"""The short form of `make fuzz`, as `make test` runs it: a live cluster (broker, one prefill node,
one decode node, the gateway; tiny model) takes 25 s of generated hostile traffic on every target
(the broker unregistered and from registered gateway / prefill / decode sessions, the decode node's
KV endpoint, the gateway's HTTP and WebSocket APIs); then every process must be alive, none may
have grown more than the run's RSS bound over its post-warm-up baseline, the decode node's KV must
be back to idle, and a normal request must stream a completion. About 40 s in all."""

from __future__ import annotations

import pytest

from harness.fuzz.fuzz_runner import FuzzOptions, run_fuzz
from harness.fuzz.loop import TARGETS

pytestmark = pytest.mark.integration
SHORT = FuzzOptions(seconds=25.0, seed=1, warmup_s=5.0, settle_s=2.0, kv_idle_timeout_s=15.0, results_dir=None,
                    verbose=False)


@pytest.fixture(scope="module")
def run():
    return run_fuzz(SHORT)


def test_every_target_got_hostile_traffic(run):
    families = {key.split(".")[1] for key in run["counts"] if key.startswith("sent.")}
    assert {target.split(".")[0] for target in TARGETS} <= families
    sessions = {key.split(".")[2] for key in run["counts"] if key.startswith("sent.session.")}
    assert sessions == {"gateway", "prefill", "decode"}


def test_every_process_survived_within_its_memory_bound(run):
    assert all(run["alive"].values()), run["deaths"]
    assert set(run["rss_growth"]) == set(run["alive"])
    assert all(mib <= SHORT.rss_bound_mib for mib in run["rss_growth"].values()), run["rss_growth"]


def test_the_cluster_still_serves_and_its_kv_is_back_to_idle(run):
    assert run["final_request"]["ok"], run["final_request"]
    assert all(run["kv_idle"].values())
    assert run["ok"], run["problems"]
