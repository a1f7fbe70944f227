"""`pdbus chaos` arguments: the scenario names and the short form reach the runner's options,
and a bad scenario name is refused by the parser (exit 2) before any process starts."""

from __future__ import annotations

import pytest

from harness.chaos import chaos_runner
from harness.chaos.scenarios import SCENARIOS, SHORT
from nodes import cli


def test_every_issue_scenario_exists_and_the_short_form_is_a_subset():
    assert list(SCENARIOS) == ["kill-decode", "freeze-decode", "kill-prefill", "restart-broker", "kill-broker", "corrupt-kv",
                               "drop-kv", "slow-consumer", "abort-storm", "partition", "hostile-peer"]
    assert set(SHORT) <= set(SCENARIOS) and chaos_runner.short_options().scenarios == list(SHORT)


def test_flags_become_options(monkeypatch):
    seen = []
    monkeypatch.setattr(chaos_runner, "main", lambda options: seen.append(options) or 0)
    assert cli.main(["chaos", "--scenario", "drop-kv", "--scenario", "partition", "--kv", "int8",
                     "--requests", "3", "--driver", "bus"]) == 0
    options = seen[0]
    assert options.scenarios == ["drop-kv", "partition"] and options.kv == "int8" and options.num_requests == 3
    assert options.driver == "bus" and options.enforce_recovery_bound and options.dtype == "float32"
    assert chaos_runner.must_be_identical(chaos_runner.ChaosOptions())
    assert cli.main(["chaos", "--short"]) == 0
    assert seen[1].scenarios == list(SHORT) and seen[1].model == "tiny" and not seen[1].enforce_recovery_bound
    assert cli.main(["chaos", "--dtype", "bfloat16", "--kv", "int8"]) == 0
    assert seen[2].dtype == "bfloat16" and not chaos_runner.must_be_identical(seen[2])
    assert not chaos_runner.must_be_identical(chaos_runner.ChaosOptions(dtype="bfloat16"))   # bf16 moves with batch shapes


def test_the_cluster_runs_the_chosen_dtype():
    cluster = chaos_runner.build_cluster(chaos_runner.ChaosOptions(dtype="bfloat16", scenarios=["kill-decode"]))
    assert cluster.settings["engine"]["dtype"] == "bfloat16" and cluster.proxied is None


def test_an_unknown_scenario_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["chaos", "--scenario", "meteor"])
    assert info.value.code == 2 and "meteor" in capsys.readouterr().err


def test_the_runner_refuses_unknown_names_before_starting_anything():
    with pytest.raises(ValueError, match="unknown scenarios: meteor"):
        chaos_runner.run_chaos(chaos_runner.ChaosOptions(scenarios=["meteor"]))
