"""PNG plots of a sweep: p99 TPOT, p99 TTFT and SLO attainment against request rate, one line per
system (matplotlib, Agg backend, no display needed).

Contract: `plot(rows, path, title) -> Path` writes one PNG with three panels; systems that did not
run are named in the legend as such.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from harness.bench.serve.serve_report import ATTAINMENT_TARGET, _rate, measured  # noqa: E402

PANELS = (("p99_tpot_ms", "p99 TPOT (ms)"), ("p99_ttft_ms", "p99 TTFT (ms)"), ("slo_attainment", "SLO attainment"))


def plot(rows: list[dict], path: Path, title: str = "", slo_tpot_ms: float | None = None) -> Path:
    systems = list(dict.fromkeys(r["system"] for r in rows))
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for axis, (key, label) in zip(axes, PANELS, strict=True):
        for system in systems:
            points = [(_rate(r), r[key]) for r in measured(rows, system)]
            if points:
                axis.plot(*zip(*points, strict=True), marker="o", label=system)
            else:
                status = next(r.get("status", "") for r in rows if r["system"] == system)
                axis.plot([], [], linestyle="none", label=f"{system}: {status[:24]}")
        axis.set_xlabel("request rate (req/s)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[2].axhline(ATTAINMENT_TARGET, color="grey", linestyle="--", linewidth=1)
    axes[2].set_ylim(0, 1.05)
    if slo_tpot_ms:
        axes[0].axhline(slo_tpot_ms, color="grey", linestyle="--", linewidth=1)
    axes[2].legend(fontsize=8, loc="lower left")
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
