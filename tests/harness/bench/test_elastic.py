"""The elasticity benchmark's command line: `--workload phased` presets, the `pdbus-elastic` system
and its `[planner]` table (accepted by the planner as it is), `--planner-set` overrides."""

from __future__ import annotations

import argparse

import pytest

from harness.bench.serve import elastic
from harness.bench.serve.serve_cli import add_arguments, build_systems, sweep_config
from nodes.planner.planner_run import planner_options


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_phased_presets():
    quick = sweep_config(parse("--workload", "phased", "--quick", "--model", "tiny"))
    assert (quick.rates, quick.phase_duration_s, quick.output_scale, quick.tag) == ([2.0], 90.0, 0.5, "elastic-quick")
    assert quick.vocab_size == 512 and not quick.phase_same_rate
    full = sweep_config(parse("--workload", "phased"))
    assert (full.rates, full.phase_duration_s, full.output_scale, full.tag) == ([1.5, 2.5], 150.0, 1.0, "elastic")
    mine = sweep_config(parse("--workload", "phased", "--request-rates", "3", "--phase-duration-s", "20",
                              "--phase-same-rate", "--tag", "t"))
    assert (mine.rates, mine.phase_duration_s, mine.phase_same_rate, mine.tag) == ([3.0], 20.0, True, "t")
    assert sweep_config(parse("--quick")).tag == "serve-quick"    # other workloads: as before


def test_the_elastic_planner_table_is_one_the_planner_takes():
    options = planner_options({"planner": elastic.planner_table([])})
    config = options.config
    assert (config.min_prefill, config.max_prefill, config.max_decode, config.max_nodes) == (0, 1, 2, 2)
    assert (config.interval_s, config.sustain_s, config.cooldown_s) == (1.0, 5.0, 10.0)
    assert config.ttft_p90_target_s > 0 and config.tpot_p90_target_s > 0 and options.slo_window_s == 10.0
    assert options.gateway_metrics_url is None    # `pdbus cluster --planner` fills in its own gateway


def test_planner_set_overrides_keys_with_toml_values():
    table = elastic.planner_table(["sustain_s=3", "ttft_p90_target_s = 4.5", 'gateway_metrics_url=""'])
    assert (table["sustain_s"], table["ttft_p90_target_s"], table["gateway_metrics_url"]) == (3, 4.5, "")
    for bad in ("sustain_s", "=3", "x=not toml"):
        with pytest.raises(ValueError):
            elastic.planner_table([bad])


def test_the_elastic_system_is_built_by_name():
    args = parse("--systems", "pdbus-disagg,pdbus-coloc,pdbus-elastic", "--workload", "phased", "--quick",
                 "--model", "tiny", "--planner-set", "cooldown_s=20")
    config = sweep_config(args)
    disagg, coloc, elastic_system = build_systems(args.systems.split(","), args, config)
    assert elastic_system.name == "pdbus-elastic" and elastic_system.planner["cooldown_s"] == 20
    assert elastic_system.env["PDBUS__NODE__DRAIN_TIMEOUT_S"] == "10.0"
    assert elastic_system.env["PDBUS__ENGINE__NUM_THREADS"] == "1"        # as the static systems
    assert str(elastic_system.log_path).endswith("elastic-quick-pdbus-elastic-cluster.log")
    assert disagg.planner is None and coloc.colocated


def test_the_planner_without_its_memory_is_the_same_planner_with_no_dwell():
    args = parse("--systems", "pdbus-elastic,pdbus-elastic-nomemory", "--workload", "phased", "--quick",
                 "--model", "tiny", "--planner-set", "cooldown_s=20")
    config = sweep_config(args)
    with_memory, without = build_systems(args.systems.split(","), args, config)
    assert without.name == "pdbus-elastic-nomemory" and without.planner["regret_dwell_s"] == 0
    assert with_memory.planner["regret_dwell_s"] == elastic.ELASTIC_PLANNER["regret_dwell_s"]
    assert {k: v for k, v in without.planner.items() if k != "regret_dwell_s"} == \
        {k: v for k, v in with_memory.planner.items() if k != "regret_dwell_s"}
    assert str(without.log_path).endswith("elastic-quick-pdbus-elastic-nomemory-cluster.log")
