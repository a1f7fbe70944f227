"""The comparison: a printed table, per-system capacity at >= 90% SLO attainment, the targets of
issue 8 checked on the measured rows, and a summary dict (`results/<tag>-summary.json`).

Contract (pure): `table(rows) -> str` (markdown, one line per system and rate; a system that did
not run is one line with its status); `capacities(rows) -> {system: rate | None}`;
`targets(rows, disagg, coloc, vllm) -> list[dict(name, value, goal, met, note)]`;
`summary(rows, config) -> dict`.
"""

from __future__ import annotations

import math

from harness.bench.serve import vm_speed
from harness.bench.serve.serve_metrics import highest_rate_meeting

ATTAINMENT_TARGET = 0.9
COLUMNS = ("system", "rate (req/s)", "served req/s", "out tok/s", "p50/p99 TTFT ms", "p50/p99 TPOT ms",
           "p99 ITL ms", "SLO attain.", "SLO goodput (req/s)", "failed")


def _rate(row: dict) -> float:
    return math.inf if row["request_rate"] == "inf" else float(row["request_rate"])


def _line(row: dict) -> list[str]:
    if row.get("status") != "ok":
        return [row["system"], "-", row.get("status", "?"), *["-"] * (len(COLUMNS) - 3)]
    return [row["system"], row["request_rate"], f"{row['request_throughput']:.2f}", f"{row['output_throughput']:.0f}",
            f"{row['median_ttft_ms']:.0f} / {row['p99_ttft_ms']:.0f}",
            f"{row['median_tpot_ms']:.0f} / {row['p99_tpot_ms']:.0f}", f"{row['p99_itl_ms']:.0f}",
            f"{row['slo_attainment']:.0%}", f"{row['slo_goodput']:.2f}", str(row["failed"])]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_line(row)) + " |" for row in rows]
    return "\n".join(lines)


def measured(rows: list[dict], system: str) -> list[dict]:
    return sorted((r for r in rows if r["system"] == system and r.get("status") == "ok"), key=_rate)


def capacities(rows: list[dict]) -> dict[str, float | None]:
    systems = dict.fromkeys(r["system"] for r in rows)
    return {s: highest_rate_meeting([(_rate(r), r["slo_attainment"]) for r in measured(rows, s)], ATTAINMENT_TARGET)
            for s in systems}


def _target(name: str, value: float | None, goal: str, met: bool | None, note: str = "") -> dict:
    return {"name": name, "value": value, "goal": goal, "met": met, "note": note}


def targets(rows: list[dict], disagg: str = "pdbus-disagg", coloc: str = "pdbus-coloc", vllm: str = "vllm") -> list[dict]:
    caps = capacities(rows)
    found = []
    by_rate = {_rate(r): r for r in measured(rows, disagg)}
    d_cap, c_cap = caps.get(disagg), caps.get(coloc)
    if c_cap is not None and c_cap in by_rate:
        c_row = next(r for r in measured(rows, coloc) if _rate(r) == c_cap)
        ratio = by_rate[c_cap]["p99_tpot_ms"] / c_row["p99_tpot_ms"]
        found.append(_target("p99 TPOT disagg/coloc at coloc's highest >=90% rate", ratio, "<= 0.5",
                             ratio <= 0.5, f"at {c_cap:g} req/s"))
    else:
        found.append(_target("p99 TPOT disagg/coloc at coloc's highest >=90% rate", None, "<= 0.5", None,
                             "colocated met 90% attainment at no measured rate"))
    if d_cap is not None and c_cap is not None and math.isinf(c_cap):
        found.append(_target("highest rate at >=90% attainment, disagg/coloc", None, ">= 1.5", None,
                             "colocated met 90% at every measured rate: the sweep did not reach its limit"))
    elif d_cap is not None and c_cap is not None:
        found.append(_target("highest rate at >=90% attainment, disagg/coloc", d_cap / c_cap, ">= 1.5",
                             d_cap / c_cap >= 1.5, f"{d_cap:g} vs {c_cap:g} req/s (measured grid)"))
    else:
        found.append(_target("highest rate at >=90% attainment, disagg/coloc", None, ">= 1.5", None,
                             f"capacities {d_cap} / {c_cap}: a system met 90% at no measured rate"))
    v_rows, d_rows = measured(rows, vllm), measured(rows, disagg)
    if v_rows and d_rows:
        d_best = max(r["slo_goodput"] for r in d_rows)
        v_best = max(r["slo_goodput"] for r in v_rows)
        found.append(_target("best SLO goodput, disagg/vLLM", d_best / v_best if v_best else None, ">= 1.0",
                             v_best > 0 and d_best >= v_best))
    else:
        found.append(_target("best SLO goodput, disagg/vLLM", None, ">= 1.0", None,
                             "vLLM not installed" if not v_rows else f"{disagg} not measured"))
    shares = [r["pdbus_stages_long_prompts"]["mean_kv_transfer_ms"] / r["pdbus_stages_long_prompts"]["mean_ttft_ms"]
              for r in measured(rows, disagg) if r.get("pdbus_stages_long_prompts", {}).get("mean_ttft_ms")]
    if shares:
        share = min(shares)
        found.append(_target("KV transfer / mean TTFT, prompts >= 1024 tokens", share, "<= 0.05", share <= 0.05,
                             "lowest-load rate; node-side ttft_s" if len(shares) > 1 else ""))
    return found


def targets_text(found: list[dict]) -> str:
    lines = []
    for t in found:
        verdict = {True: "MET", False: "MISSED", None: "not measurable"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3g}"
        lines.append(f"- {t['name']}: {value} (goal {t['goal']}) {verdict}" + (f" — {t['note']}" if t["note"] else ""))
    return "\n".join(lines)


def stages_text(rows: list[dict]) -> str:
    lines = ["| system | rate | plan | queue | prefill | kv_transfer | kv_wait | decode_queue | node TTFT (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        stages = row.get("pdbus_stages") or {}
        if stages:
            names = ("plan", "queue", "prefill", "kv_transfer", "kv_wait", "decode_queue", "ttft")
            lines.append(f"| {row['system']} | {row['request_rate']} | "
                         + " | ".join(f"{stages[f'mean_{n}_ms']:.0f}" for n in names) + " |")
    return "\n".join(lines)


def summary(rows: list[dict], config: dict) -> dict:
    keys = ("system", "status", "request_rate", "completed", "failed", "request_throughput", "output_throughput",
            "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "slo_attainment",
            "slo_goodput", "request_goodput", "load_average_1m", "pdbus_stages", "pdbus_stages_long_prompts",
            "phases", "planner_decisions", "role_timeline", "vm_speed")   # phases..role_timeline: phased rows only
    return {"config": config, "rows": [{k: r[k] for k in keys if k in r} for r in rows],
            "capacity_at_90pct": capacities(rows), "targets": targets(rows), "vm_speed_drift": vm_speed.drift(rows)}
