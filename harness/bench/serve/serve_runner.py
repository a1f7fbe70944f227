"""The sweep: for each system, start it, warm it up, measure each rate, stop it.

Contract:
- `SweepConfig`: the workload (`mixed`, `random`, `shared-prefix`, `multi-turn`, `phased`),
  `num_prompts` per rate, `rates` (req/s;
  `inf` = all at once), `max_concurrency`, `burstiness`, `seed`, `num_warmup`, percentiles,
  goodput bounds, the SLO, the model and its vocabulary size.
- `requests_for(config, rate_index)` -> (specs, offsets): rate i uses seed `seed + i` for its
  prompts (a new seed per run, so no prefix cache can help) and the same for every system, so
  systems see identical requests at identical times. `phased` (`phased_workload`): rate r is the
  chat phases' rate, each phase `phase_duration_s` long (`num_prompts` unused: the count follows).
- `run_system(system, config, progress)` -> list[dict]: one vLLM-keyed result dict per rate (also
  written to `results/serve-<tag>-<system>-<rate>.json`), or one `{"system", "status": "not
  installed" | "failed: ..."}` row when the system cannot run. Warm-up requests (a chat and a
  document at concurrency 1, the first step of every kind of work) are sent first and excluded.
  A phased row adds `phases` (`phase_metrics.phase_summaries`) and, from a system with a
  `timeline` (pdbus), `planner_decisions` and `role_timeline` (`cluster_events.timeline`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from harness.bench.serve import phased_workload as pw
from harness.bench.serve import serve_workload as wl
from harness.bench.serve import vm_speed
from harness.bench.serve.load_generator import RequestResult, run_load
from harness.bench.serve.phase_metrics import phase_summaries
from harness.bench.serve.serve_metrics import MIXED_SLO, Slo, stage_means, summarize
from harness.bench.serve.systems import SystemUnavailable


@dataclass
class SweepConfig:
    workload: str = "mixed"
    num_prompts: int = 60
    rates: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0, 1.5])
    max_concurrency: int | None = None
    burstiness: float = 1.0
    seed: int = 0
    num_warmup: int = 2
    output_scale: float = 1.0          # mixed, phased...: multiplies output lengths
    phase_duration_s: float = 60.0     # phased: each phase's length
    phase_same_rate: bool = False      # phased: the document phase at the chat rate too (not equal tokens)
    input_len: int = 512               # random workload
    output_len: int = 64
    range_ratio: float = 0.9
    percentiles: list[float] = field(default_factory=lambda: [50, 90, 99])
    goodput: dict[str, float] = field(default_factory=dict)
    slo: Slo = MIXED_SLO
    model: str | None = None
    vocab_size: int = 49152
    results_dir: Path = Path("results")
    tag: str = "serve"


def _specs(config: SweepConfig, num: int, seed: int) -> list[wl.RequestSpec]:
    if config.workload == "mixed":
        return wl.mixed_workload(num, seed, config.vocab_size, config.output_scale)
    if config.workload == "random":
        return wl.random_workload(num, config.input_len, config.output_len, config.range_ratio,
                                  config.vocab_size, seed)
    if config.workload == "shared-prefix":
        return wl.shared_prefix_workload(num, seed, config.vocab_size, config.output_scale)
    if config.workload == "multi-turn":
        return wl.multi_turn_workload(num, seed, config.vocab_size, config.output_scale)
    raise ValueError(f"unknown workload {config.workload!r} (mixed, random, shared-prefix, multi-turn, phased)")


def phase_plan_for(config: SweepConfig, rate_index: int) -> list[pw.Phase]:
    return pw.phase_plan(config.rates[rate_index], config.phase_duration_s, config.phase_same_rate)


def requests_for(config: SweepConfig, rate_index: int) -> tuple[list[wl.RequestSpec], list[float]]:
    """Conversations (a request with `after`) start at the arrival times, at the rate divided by
    their turns so the request rate stays the rate; a later turn waits for its predecessor only."""
    seed = config.seed + rate_index
    if config.workload == "phased":
        return pw.phased_workload(phase_plan_for(config, rate_index), seed, config.vocab_size, config.output_scale,
                                  config.burstiness)
    specs = _specs(config, config.num_prompts, seed)
    starts = [i for i, spec in enumerate(specs) if spec.after < 0]
    rate = config.rates[rate_index] * len(starts) / len(specs)
    offsets = [0.0] * len(specs)
    for i, offset in zip(starts, wl.arrival_offsets(len(starts), rate, config.burstiness, seed + 10_000), strict=True):
        offsets[i] = offset
    return specs, offsets


def warmup_specs(config: SweepConfig) -> list[wl.RequestSpec]:
    if config.workload in ("mixed", "phased"):
        by_kind = {s.kind: s for s in wl.mixed_workload(10, config.seed - 1, config.vocab_size, 0.1)}
        return list(by_kind.values())[: config.num_warmup]
    return _specs(config, config.num_warmup, config.seed - 1)


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]


def _rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def measure(url: str, model: str, config: SweepConfig, rate_index: int, progress=None, timeline=None) -> dict:
    specs, offsets = requests_for(config, rate_index)
    on_done = (lambda _r: progress.update(1)) if progress is not None else None
    started = time.time()
    results, duration = asyncio.run(run_load(url, model, specs, offsets=offsets,
                                             max_concurrency=config.max_concurrency, on_done=on_done))
    row = result_dict(config, rate_index, results, duration)
    if config.workload == "phased":
        row["phases"] = phase_summaries(results, phase_plan_for(config, rate_index), config.slo, config.percentiles)
        row["request_phases"], row["num_prompts"] = [r.phase for r in results], len(results)
        row |= timeline(started, time.time()) if timeline is not None else {}
    return row


def result_dict(config: SweepConfig, rate_index: int, results: list[RequestResult], duration: float) -> dict:
    rate = config.rates[rate_index]
    summary = summarize(results, duration, config.percentiles, config.goodput or None, config.slo)
    summary["slo_goodput"] = summary["num_slo_met"] / max(duration, 1e-9)
    long_prompts = [r for r in results if r.prompt_len >= 1024]
    return {"date": time.strftime("%Y%m%d-%H%M%S"), "request_rate": _rate_label(rate),
            "load_average_1m": os.getloadavg()[0],   # the machine is shared: background load skews a rate
            "burstiness": config.burstiness, "max_concurrency": config.max_concurrency,
            "num_prompts": config.num_prompts, "workload": config.workload, "seed": config.seed + rate_index,
            **summary, "pdbus_stages": stage_means(results), "pdbus_stages_long_prompts": stage_means(long_prompts),
            "kinds": [r.kind for r in results], "input_lens": [r.prompt_len for r in results],
            "output_lens": [r.output_tokens for r in results], "ttfts": [r.ttft for r in results],
            "start_times": [r.start_time for r in results]}


def run_system(system, config: SweepConfig, progress=None) -> list[dict]:
    name = system.name
    if not system.available():
        return [{"system": name, "status": "not installed"}]
    before = vm_speed.probe()   # the VM's rate as this system starts and after it stopped (vm_speed.py)
    try:
        url = system.start()
    except SystemUnavailable as exc:
        return [{"system": name, "status": str(exc)}]
    rows: list[dict] = []
    try:
        model = served_model(url)
        asyncio.run(run_load(url, model, warmup_specs(config), max_concurrency=1))
        for index, rate in enumerate(config.rates):
            if progress is not None:
                progress.set_description(f"{name} @ {_rate_label(rate)} req/s")
            rows.append({"system": name, "status": "ok", "model_id": model,
                         **measure(url, model, config, index, progress, getattr(system, "timeline", None))})
    except Exception as exc:   # report what was measured; the sweep goes on with the next system
        rows.append({"system": name, "status": f"failed: {type(exc).__name__}: {exc}"})
    finally:
        system.stop()
    after = vm_speed.probe()
    for row in rows:   # written once, the probes in: a sweep's measuring errors end up in `rows` too
        row["vm_speed"] = {"before": before, "after": after}
        if row["status"] == "ok":
            _write(config, row)
    return rows


def _write(config: SweepConfig, row: dict) -> Path:
    config.results_dir.mkdir(parents=True, exist_ok=True)
    path = config.results_dir / f"{config.tag}-{row['system']}-{row['request_rate']}.json"
    path.write_text(json.dumps(row, indent=1, default=str))
    return path


def config_dict(config: SweepConfig) -> dict:
    values = asdict(config)
    values["rates"] = [_rate_label(r) for r in config.rates]
    values["results_dir"] = str(config.results_dir)
    return values
