"""The elasticity benchmark's part of the serving benchmark's command line (issue #42 item 6):
`--workload phased` and the `pdbus-elastic` system.

Contract:
- `ELASTIC_PLANNER`: the `[planner]` table of `pdbus-elastic` (the values below, and why);
  `ELASTIC_ENV`: its node settings beside it. `planner_table(items)`: that table with `KEY=VALUE`
  overrides (`--planner-set`, values TOML literals; ValueError for a malformed item).
- `add_arguments(parser)`: `--phase-duration-s`, `--phase-same-rate`, `--planner-set`.
- `with_phases(args, config) -> SweepConfig`: for `--workload phased`, the phased presets where
  the flags leave them open: `--quick` 2 req/s (chat phases), 90 s phases (~6 min a system here);
  the default 1.5 and 2.5 req/s, 150 s phases (~17 min a system); tag `elastic-quick` / `elastic`.
  Output lengths follow the serving presets (`--quick` halves them). Other workloads: unchanged.
- `ELASTIC_SYSTEMS`: the planner systems by name (`pdbus-elastic`; `pdbus-elastic-nomemory`, the
  same without the layout memory) -> their overrides of that table.
- `elastic_system(args, config, env, name) -> PdbusSystem`: `pdbus cluster --planner`, 1 prefill +
  1 decode node, both switchable. KeyError for a name not in `ELASTIC_SYSTEMS`.
- `report(rows, config, args) -> dict`: prints the per-phase table and the elasticity targets,
  writes `<tag>-phases.png` (unless `--no-plot`); returns what the summary adds
  (`elastic_targets`). Rows without phases: prints nothing, returns {}.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib

from harness.bench.serve import phase_plots
from harness.bench.serve.phase_metrics import elastic_targets, phase_table
from harness.bench.serve.serve_report import targets_text
from harness.bench.serve.serve_runner import SweepConfig
from harness.bench.serve.systems import PdbusSystem

# Two node processes on two cores, as the static systems have: the planner may only switch roles.
# min_prefill 0: in a chat phase the prefill node may become a second decode node (decode nodes
# then prefill locally, in chunks between decode steps); TTFT p90 over its target takes it back.
# Cold thresholds 0: never cold, so never a drain, which would leave a core idle until a new
# process loads the model. Targets: TTFT p90 2 s (the chat SLO; a document phase's p90 is a
# document's TTFT, past it whenever prefill queues), TPOT p90 80 ms (the SLO is 100 ms; at 50 ms
# the colocated pair's own chunked prefills, p90 ~55 ms, split it again within a chat phase: run of
# 12-05 15:26). Timings for phases of minutes; the p90s over 10 s. What a layout scored is
# remembered 120 s, most of a phase: at 60 s the pair split again the moment it ran out (18:40).
ELASTIC_PLANNER: dict[str, object] = {
    "min_prefill": 0, "max_prefill": 1, "min_decode": 1, "max_decode": 2, "max_nodes": 2,
    "interval_s": 1.0, "sustain_s": 5.0, "cooldown_s": 10.0, "settle_timeout_s": 60.0, "missing_grace_s": 10.0,
    "prefill_cold_batches": 0.0, "decode_cold_use": 0.0, "ttft_p90_target_s": 2.0, "tpot_p90_target_s": 0.08,
    "slo_window_s": 10.0, "regret_dwell_s": 120.0,
}
ELASTIC_ENV = {"PDBUS__NODE__DRAIN_TIMEOUT_S": "10.0"}   # a switch waits this long for the old role's work
# The planner as configured, and (an ablation) without its layout memory: every switch the rules
# ask for is made, as the planner was before it remembered what each layout scored.
ELASTIC_SYSTEMS: dict[str, dict[str, object]] = {"pdbus-elastic": {}, "pdbus-elastic-nomemory": {"regret_dwell_s": 0.0}}
QUICK_PHASED = ([2.0], 90.0)          # (chat phases' req/s, seconds per phase)
FULL_PHASED = ([1.5, 2.5], 150.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--phase-duration-s", type=float, help="phased: seconds per phase (default 150, quick 90)")
    parser.add_argument("--phase-same-rate", action="store_true",
                        help="phased: the document phase at the chat phases' rate (default: equal prompt tokens/s)")
    parser.add_argument("--planner-set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="pdbus-elastic: override its [planner] keys (TOML values)")


def planner_table(items: list[str]) -> dict[str, object]:
    table = dict(ELASTIC_PLANNER)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--planner-set takes KEY=VALUE, got {item!r}")
        try:
            table[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"--planner-set {item!r}: not a TOML value ({exc})") from exc
    return table


def with_phases(args: argparse.Namespace, config: SweepConfig) -> SweepConfig:
    if config.workload != "phased":
        return config
    rates, duration_s = QUICK_PHASED if args.quick else FULL_PHASED
    return dataclasses.replace(config, rates=config.rates if args.request_rates else list(rates),
                               phase_duration_s=float(args.phase_duration_s or duration_s),
                               phase_same_rate=bool(args.phase_same_rate),
                               tag=args.tag or ("elastic-quick" if args.quick else "elastic"))


def elastic_system(args: argparse.Namespace, config: SweepConfig, env: dict[str, str],
                   name: str = "pdbus-elastic") -> PdbusSystem:
    planner = planner_table(args.planner_set) | ELASTIC_SYSTEMS[name]
    return PdbusSystem(name, colocated=False, model=args.model, config=getattr(args, "config", None),
                       env=env | ELASTIC_ENV, planner=planner,
                       log_path=config.results_dir / f"{config.tag}-{name}-cluster.log")


def decisions_text(rows: list[dict]) -> str:
    return "\n".join(f"  {row['system']} @{row['request_rate']} t={d['t_s']:.0f}s {d['kind']} {d['node_id']} -> "
                     f"{d['role']}: {d['reason']}" for row in rows for d in row.get("planner_decisions") or [])


def report(rows: list[dict], config: SweepConfig, args: argparse.Namespace) -> dict:
    if not any(row.get("phases") for row in rows):
        return {}
    print("\nper phase (requests by the phase they were sent in; goodput = SLO met / phase duration):")
    print(phase_table(rows))
    found = elastic_targets(rows)
    if found:
        print(targets_text(found))
    if decisions_text(rows):
        print(decisions_text(rows))
    if not args.no_plot:
        title = f"phased workload, {config.phase_duration_s:g} s phases"
        png = phase_plots.plot_phases(rows, config.results_dir / f"{config.tag}-phases.png", title, config.slo.tpot_ms)
        print(f"phase plot: {png}")
    return {"elastic_targets": found}
