"""Flags and presets of the serving benchmark, shared by `pdbus bench` and `python -m harness.bench.serve`.

Contract: `add_arguments(parser)`, `main(args) -> int`, `run(argv) -> int`.
Presets: `--quick` (what `make bench-quick` runs, < 10 min here): rates 0.5, 1, 1.5 req/s, 24
requests each, the mixed workload with output lengths halved (chats 64 tokens out, documents 32;
prompt lengths unchanged). The default (`make bench`): rates 0.25 .. 2 req/s, 60 requests each,
the mixed workload at full size. Systems: `pdbus-disagg` (1 prefill + 1 decode node),
`pdbus-coloc` (2 `both` nodes), `vllm` (vLLM's own OpenAI server on both cores) and `pdbus-vllm`
(1 prefill + 1 decode node running vLLM engines, KV over pdbus); the two vLLM lines say "not
installed" without `make install-vllm`. Every pdbus node runs one thread; the engine dtype is
`--dtype` (bfloat16, the engine's fast path). Each rate uses a new seed, so a prompt repeats only
where the workload shares it on purpose (`shared-prefix`, `multi-turn`); there pdbus reuses KV
across requests (the prefill prefix cache, the decode node's kept prefixes and sessions) and
`pdbus-disagg-nocache` (by name only) is the same cluster keeping none of it; `pdbus-disagg-nolend`
(by name only) is pdbus-disagg whose decode node never prefills a prompt a prefill node could
(`[decode] lend_prefill_tokens = 0`; config/local.toml lends).
Writes `results/<tag>-<system>-<rate>.json`, `results/<tag>-summary.json` and `results/<tag>.png`.
The elasticity benchmark (`harness.bench.serve.elastic`): `--workload phased` (chat-heavy, then
document-heavy, then chat-heavy; per-phase results, `results/<tag>-phases.png`) and the system
`pdbus-elastic` (by name only: `pdbus cluster --planner` on 1 prefill + 1 decode switchable node) and
`pdbus-elastic-nomemory` (the same planner without its layout memory, `regret_dwell_s = 0`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TypedDict

from tqdm import tqdm

from harness.bench.serve import elastic, plots, serve_report, vm_speed
from harness.bench.serve.serve_metrics import MIXED_SLO, Slo, parse_goodput
from harness.bench.serve.serve_runner import SweepConfig, config_dict, requests_for, run_system
from harness.bench.serve.systems import PdbusSystem, VllmSystem

SYSTEMS = ("pdbus-disagg", "pdbus-coloc", "vllm", "pdbus-vllm")   # the default sweep
EXTRA_SYSTEMS = ("pdbus-disagg-nocache", "pdbus-disagg-nolend")   # by name only: variants of pdbus-disagg
NO_LEND = {"PDBUS__DECODE__LEND_PREFILL_TOKENS": "0"}
NO_CACHE = {"PDBUS__PREFILL__PREFIX_CACHE_MIB": "0", "PDBUS__ENGINE__KEEP_PREFIXES": "false",
            "PDBUS__ENGINE__KEEP_SESSIONS": "false"}


class Preset(TypedDict):
    """A sweep's defaults where a flag leaves them: `--quick`'s or the full run's."""
    rates: list[float]
    num_prompts: int
    output_scale: float


QUICK: Preset = {"rates": [0.5, 1.0, 1.5], "num_prompts": 24, "output_scale": 0.5}
FULL: Preset = {"rates": [0.25, 0.5, 0.75, 1.0, 1.5, 2.0], "num_prompts": 60, "output_scale": 1.0}
VOCAB_SIZES = {"tiny": 512}
SMOLLM2_VOCAB = 49152


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="the reduced sweep of `make bench-quick`")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {SYSTEMS + EXTRA_SYSTEMS} (default: the first four)")
    parser.add_argument("--workload", choices=["mixed", "random", "shared-prefix", "multi-turn", "phased"],
                        default="mixed")
    parser.add_argument("--request-rates", help="comma-separated req/s (`inf`: all at once)")
    parser.add_argument("--num-prompts", type=int, help="requests per rate")
    parser.add_argument("--max-concurrency", type=int, help="cap on requests in flight (fixed-concurrency load)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-warmup", type=int, default=2, help="warm-up requests per system, not measured")
    parser.add_argument("--output-scale", type=float, help="mixed workload: multiply the output lengths")
    parser.add_argument("--random-input-len", type=int, default=512)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--random-range-ratio", type=float, default=0.9)
    parser.add_argument("--percentile-metrics-percentiles", dest="percentiles", default="50,90,99")
    parser.add_argument("--goodput", nargs="*", default=[], help="vLLM's SLO bounds: ttft:MS tpot:MS e2el:MS")
    parser.add_argument("--slo-ttft-ms", type=float, help="one TTFT SLO for every kind (default: chat 2000, "
                                                          "document 6000)")
    parser.add_argument("--slo-tpot-ms", type=float, default=MIXED_SLO.tpot_ms)
    parser.add_argument("--model", help="model spec for every node (default: the config's, SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--vocab-size", type=int, help="prompt token ids are drawn below this")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", help="file name prefix (default serve-quick / serve)")
    parser.add_argument("--no-plot", action="store_true")
    elastic.add_arguments(parser)


def _floats(text: str) -> list[float]:
    return [math.inf if item.strip() == "inf" else float(item) for item in text.split(",") if item.strip()]


def sweep_config(args: argparse.Namespace) -> SweepConfig:
    preset = QUICK if args.quick else FULL
    slo = MIXED_SLO if args.slo_ttft_ms is None else Slo({"*": args.slo_ttft_ms}, args.slo_tpot_ms)
    slo = Slo(slo.ttft_ms, args.slo_tpot_ms)
    vocab = args.vocab_size or VOCAB_SIZES.get(args.model or "", SMOLLM2_VOCAB)
    return elastic.with_phases(args, SweepConfig(
        workload=args.workload, num_prompts=args.num_prompts or preset["num_prompts"],
        rates=_floats(args.request_rates) if args.request_rates else preset["rates"],
        max_concurrency=args.max_concurrency, burstiness=args.burstiness, seed=args.seed,
        num_warmup=args.num_warmup,
        output_scale=args.output_scale if args.output_scale is not None else preset["output_scale"],
        input_len=args.random_input_len, output_len=args.random_output_len, range_ratio=args.random_range_ratio,
        percentiles=_floats(args.percentiles), goodput=parse_goodput(args.goodput), slo=slo, model=args.model,
        vocab_size=vocab, results_dir=Path(args.results_dir),
        tag=args.tag or ("serve-quick" if args.quick else "serve")))


def build_systems(names: list[str], args: argparse.Namespace,
                  config: SweepConfig) -> list[PdbusSystem | VllmSystem]:
    env = {"PDBUS__ENGINE__DTYPE": f'"{args.dtype}"', "PDBUS__ENGINE__NUM_THREADS": "1"}
    systems: list[PdbusSystem | VllmSystem] = []
    for name in names:
        if name == "vllm":   # its prefix caching on for the shared-prefix workload, as pdbus's is
            systems.append(VllmSystem(model=args.model, dtype=args.dtype,
                                      prefix_caching=config.workload in ("shared-prefix", "multi-turn"),
                                      log_path=config.results_dir / f"{config.tag}-vllm-server.log"))
        elif name == "pdbus-vllm":   # vLLM engines behind pdbus nodes, disaggregated (docs/VLLM.md)
            systems.append(PdbusSystem(name, colocated=False, model=args.model, config=getattr(args, "config", None),
                                       env=env, engine="vllm",
                                       log_path=config.results_dir / f"{config.tag}-{name}-cluster.log"))
        elif name in ("pdbus-disagg", "pdbus-coloc", *EXTRA_SYSTEMS):
            variant = NO_CACHE if name.endswith("nocache") else NO_LEND if name.endswith("nolend") else {}
            systems.append(PdbusSystem(name, colocated=name == "pdbus-coloc", model=args.model,
                                       config=getattr(args, "config", None), env=env | variant,
                                       log_path=config.results_dir / f"{config.tag}-{name}-cluster.log"))
        elif name in elastic.ELASTIC_SYSTEMS:
            systems.append(elastic.elastic_system(args, config, env, name))
        else:
            raise ValueError(f"unknown system {name!r}; choose from {(*SYSTEMS, *EXTRA_SYSTEMS, *elastic.ELASTIC_SYSTEMS)}")
    return systems


def main(args: argparse.Namespace) -> int:
    try:
        config = sweep_config(args)
        systems = build_systems([s.strip() for s in args.systems.split(",") if s.strip()], args, config)
    except ValueError as exc:
        print(f"pdbus bench: {exc}", file=sys.stderr)
        return 2
    total = sum(len(requests_for(config, i)[0]) for i in range(len(config.rates))) * sum(s.available() for s in systems)
    rows: list[dict] = []
    with tqdm(total=total, unit="req", dynamic_ncols=True) as progress:
        for system in systems:
            progress.set_description(f"{system.name}: starting")
            rows += run_system(system, config, progress)
    summary = serve_report.summary(rows, config_dict(config))
    print(serve_report.table(rows))
    summary |= elastic.report(rows, config, args)
    config.results_dir.mkdir(parents=True, exist_ok=True)
    summary_path = config.results_dir / f"{config.tag}-summary.json"
    summary_path.write_text(json.dumps(summary, indent=1, default=str))
    print("\nwhere TTFT goes (mean ms per stage, from the final chunks' pdbus timings):")
    print(serve_report.stages_text(rows))
    print("\ncapacity (highest measured rate at >= 90% SLO attainment):",
          {k: v for k, v in summary["capacity_at_90pct"].items()})
    print(serve_report.targets_text(summary["targets"]))
    print(vm_speed.text(rows))
    print(f"\nresults: {summary_path}")
    if not args.no_plot:
        png = plots.plot(rows, config.results_dir / f"{config.tag}.png",
                         f"{config.workload} workload, {config.num_prompts} requests per rate", config.slo.tpot_ms)
        print(f"plot: {png}")
    return 0 if all(r.get("status") in ("ok", "not installed") or "not installed" in r.get("status", "")
                    for r in rows) else 1


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="cluster config TOML (default: config/local.toml)")
    add_arguments(parser)
    return main(parser.parse_args(argv))
