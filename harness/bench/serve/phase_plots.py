"""The elasticity benchmark's PNG (`plots.py`'s style: matplotlib, Agg, no display needed).

Contract: `plot_phases(rows, path, title="", slo_tpot_ms=None) -> Path` writes one PNG: a top row
of four panels with the phases on the x axis (SLO attainment, SLO goodput, p99 TTFT, p99 TPOT),
a line per system (and rate, when there are several), and below them the timeline: each
system's node roles over the run (solid: decode nodes, dashed: prefill, dotted: `both`; each
system's lines lifted by 0.04 x its index so equal counts stay apart), its
planner's decisions as triangles, the phase boundaries as grey lines. Rows without `phases` are
left out; a system that did not run is named in the legend with its status.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from harness.bench.serve.serve_report import ATTAINMENT_TARGET  # noqa: E402

PANELS = (("slo_attainment", "SLO attainment"), ("slo_goodput", "SLO goodput (req/s)"),
          ("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_tpot_ms", "p99 TPOT (ms)"))
ROLE_STYLES = (("decode", "-"), ("prefill", "--"), ("both", ":"))
ACTIONS = ("switch_role", "scale_up", "scale_down")


def _label(row: dict, many_rates: bool) -> str:
    return f"{row['system']} @{row['request_rate']}" if many_rates else row["system"]


def _metric_panels(axes, rows: list[dict], many_rates: bool, colors: dict[str, str]) -> None:
    for axis, (key, label) in zip(axes, PANELS, strict=True):
        for row in rows:
            names = [p["phase"] for p in row["phases"]]
            axis.plot(names, [p[key] for p in row["phases"]], marker="o", color=colors[_label(row, many_rates)],
                      label=_label(row, many_rates))
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].axhline(ATTAINMENT_TARGET, color="grey", linestyle="--", linewidth=1)
    axes[0].set_ylim(0, 1.05)


def _timeline_panel(axis, rows: list[dict], many_rates: bool, colors: dict[str, str]) -> None:
    for index, row in enumerate(rows):
        color, steps = colors[_label(row, many_rates)], row.get("role_timeline") or []
        end, lift = row["phases"][-1]["end_s"], 0.04 * index   # lifted apart: equal counts would hide each other
        for role, style in ROLE_STYLES:
            if steps and any(step[role] for step in steps):
                axis.step([s["t_s"] for s in steps] + [end], [s[role] + lift for s in steps] + [steps[-1][role] + lift],
                          where="post", linestyle=style, color=color, label=f"{_label(row, many_rates)} {role}")
        times = [d["t_s"] for d in row.get("planner_decisions") or [] if d["kind"] in ACTIONS]
        axis.plot(times, [2.3] * len(times), linestyle="none", marker="v", color=color)
    _phase_lines(axis, rows[0]["phases"])


def _phase_lines(axis, phases: list[dict]) -> None:
    for phase in phases:
        axis.axvline(phase["start_s"], color="grey", linewidth=1)
        axis.text(phase["start_s"] + 1, 2.45, phase["phase"], fontsize=8, color="grey")
    axis.set_ylim(0, 2.7)
    axis.set_xlabel("time since the load started (s)")
    axis.set_ylabel("nodes by role")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right", ncol=3)


def plot_phases(rows: list[dict], path: Path, title: str = "", slo_tpot_ms: float | None = None) -> Path:
    measured = [r for r in rows if r.get("status") == "ok" and r.get("phases")]
    many_rates = len({r["request_rate"] for r in measured}) > 1
    labels = list(dict.fromkeys(_label(r, many_rates) for r in measured))
    colors = {label: f"C{i}" for i, label in enumerate(labels)}
    figure = plt.figure(figsize=(15, 7.5))
    grid = figure.add_gridspec(2, 4, height_ratios=(1, 1.1))
    axes = [figure.add_subplot(grid[0, i]) for i in range(4)]
    _metric_panels(axes, measured, many_rates, colors)
    if slo_tpot_ms:
        axes[3].axhline(slo_tpot_ms, color="grey", linestyle="--", linewidth=1)
    _legend(axes[0], rows)
    if measured:
        _timeline_panel(figure.add_subplot(grid[1, :]), measured, many_rates, colors)
    if title:
        figure.suptitle(title, fontsize=10)
    return _save(figure, path)


def _legend(axis, rows: list[dict]) -> None:
    for row in rows:
        if row.get("status") != "ok":
            axis.plot([], [], linestyle="none", label=f"{row['system']}: {row.get('status', '')[:24]}")
    axis.legend(fontsize=8, loc="lower left")


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
