"""Per-phase results of the phased workload, and the elasticity goal of issue #42 item 6 checked on
them.

Contract (pure):
- `phase_summaries(results, plan, slo, percentiles=(50, 90, 99)) -> list[dict]`: one dict per phase
  of `plan`, over the requests *sent* in it (tagged with its name; a request that ends in the next
  phase still counts for its own): `phase`, `rate` (req/s asked), `start_s`, `end_s`, `sent`,
  `completed`, `failed`, `slo_attainment` (DistServe's: met / sent, failures miss) and
  `slo_attainment_by_kind`, `num_slo_met`, `slo_goodput` (met / the phase's duration: the SLO
  goodput each phase's traffic got), `request_throughput` (completed / duration), and `serve_metrics`'
  `median_`/`p<P>_` TTFT and TPOT in ms (successful requests; 0 when there are none).
- `elastic_targets(rows, elastic="pdbus-elastic", statics=("pdbus-disagg", "pdbus-coloc"))` ->
  list of targets (`serve_report`'s shape: name, value, goal, met, note), per measured rate:
  in every phase the elastic system's SLO goodput >= the best static system's (value: the lowest
  ratio over the phases), and over the whole run its SLO goodput >= 1.3x the worst static's (the
  note gives the ceiling: what the ratio would be with every request sent within its SLO; below
  1.3 the goal is out of reach for that traffic on that machine). None
  (not measurable) where a system has no row at that rate.
- `phase_table(rows) -> str`: markdown, one line per system, rate and phase.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.bench.serve.load_generator import RequestResult
from harness.bench.serve.phased_workload import Phase
from harness.bench.serve.serve_metrics import Slo, percentile_name, summarize

BEST_GOAL, WORST_GOAL = 1.0, 1.3
LATENCY_KEYS = ("ttft", "tpot")


def phase_summaries(results: Sequence[RequestResult], plan: Sequence[Phase], slo: Slo,
                    percentiles: Sequence[float] = (50, 90, 99)) -> list[dict]:
    return [_phase_summary([r for r in results if r.phase == phase.name], phase, slo, percentiles)
            for phase in plan]


def _phase_summary(results: list[RequestResult], phase: Phase, slo: Slo, percentiles: Sequence[float]) -> dict:
    wanted = sorted({50.0, 99.0, *percentiles})
    summary = summarize(results, phase.duration_s, wanted, None, slo)
    stats = ["median", *(f"p{percentile_name(p)}" for p in wanted)]
    latencies = {f"{stat}_{m}_ms": summary[f"{stat}_{m}_ms"] for m in LATENCY_KEYS for stat in stats}
    return {"phase": phase.name, "rate": phase.rate, "start_s": phase.start_s, "end_s": phase.end_s,
            "sent": len(results), "completed": summary["completed"], "failed": summary["failed"],
            "slo_attainment": summary["slo_attainment"], "slo_attainment_by_kind": summary["slo_attainment_by_kind"],
            "num_slo_met": summary["num_slo_met"], "slo_goodput": summary["num_slo_met"] / phase.duration_s,
            "request_throughput": summary["request_throughput"], **latencies}


def _target(name: str, value: float | None, goal: str, met: bool | None, note: str = "") -> dict:
    return {"name": name, "value": value, "goal": goal, "met": met, "note": note}


def _by_rate(rows: list[dict], system: str) -> dict[str, dict]:
    return {r["request_rate"]: r for r in rows if r["system"] == system and r.get("status") == "ok" and r.get("phases")}


def _goodputs(row: dict) -> list[float]:
    return [phase["slo_goodput"] for phase in row["phases"]]


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (1.0 if value == 0 else float("inf"))


def elastic_targets(rows: list[dict], elastic: str = "pdbus-elastic",
                    statics: Sequence[str] = ("pdbus-disagg", "pdbus-coloc")) -> list[dict]:
    found = []
    for rate, row in _by_rate(rows, elastic).items():
        others = [by_rate[rate] for by_rate in (_by_rate(rows, s) for s in statics) if rate in by_rate]
        if len(others) < len(statics):
            found.append(_target(f"@{rate} req/s: elastic vs static splits", None, "measured", None,
                                 "a static system has no phased row at this rate"))
            continue
        found += [_best_target(rate, row, others), _worst_target(rate, row, others)]
    return found


def _best_target(rate: str, row: dict, others: list[dict]) -> dict:
    best = [max(phase) for phase in zip(*(_goodputs(o) for o in others), strict=True)]
    ratios = [_ratio(mine, top) for mine, top in zip(_goodputs(row), best, strict=True)]
    names = [phase["phase"] for phase in row["phases"]]
    note = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in zip(names, ratios, strict=True))
    return _target(f"@{rate} req/s: SLO goodput / best static, every phase", min(ratios), f">= {BEST_GOAL}",
                   min(ratios) >= BEST_GOAL, note)


def _worst_target(rate: str, row: dict, others: list[dict]) -> dict:
    totals = {o["system"]: sum(_goodputs(o)) for o in others}
    worst = min(totals, key=lambda s: totals[s])
    ratio = _ratio(sum(_goodputs(row)), totals[worst])
    ceiling = _ratio(sum(_offered(row)), totals[worst])
    return _target(f"@{rate} req/s: SLO goodput / worst static, whole run", ratio, f">= {WORST_GOAL}",
                   ratio >= WORST_GOAL, f"worst: {worst}; ceiling {ceiling:.2f}x (every request sent within its SLO)")


def _offered(row: dict) -> list[float]:
    """Each phase's goodput were every request sent in it within its SLO: sent / duration."""
    return [p["sent"] / (p["end_s"] - p["start_s"]) if p["end_s"] > p["start_s"] else 0.0 for p in row["phases"]]


def phase_table(rows: list[dict]) -> str:
    lines = ["| system | rate | phase | sent | SLO attain. | SLO goodput (req/s) | p50/p99 TTFT ms | p50/p99 TPOT ms "
             "| failed |", "|" + "---|" * 9]
    for row in rows:
        for p in row.get("phases") or []:
            lines.append(f"| {row['system']} | {row['request_rate']} | {p['phase']} ({p['rate']:.2f}/s) | {p['sent']} "
                         f"| {p['slo_attainment']:.0%} | {p['slo_goodput']:.2f} "
                         f"| {p['median_ttft_ms']:.0f} / {p['p99_ttft_ms']:.0f} "
                         f"| {p['median_tpot_ms']:.0f} / {p['p99_tpot_ms']:.0f} | {p['failed']} |")
    return "\n".join(lines)
