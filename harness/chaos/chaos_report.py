"""The run's table: one row per scenario, printed and written as JSON under results/.

Contract: `render_table(rows) -> str` (fixed-width text); `write_json(run, directory) -> Path`
writes `chaos-<UTC timestamp>.json` (the whole run: options, reference, every scenario's row and
details) and returns its path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

COLUMNS = [("scenario", 15), ("result", 6), ("req ok/failed", 13), ("tokens identical", 17),
           ("p50/p99 fault-free s", 20), ("p50/p99 faulted s", 18), ("recovery p99 s (bound)", 22)]


def _pair(values: dict[str, Any]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.2f}"   # noqa: E731
    return f"{fmt(values.get('p50_s'))}/{fmt(values.get('p99_s'))}"


def row_cells(row: dict[str, Any]) -> list[str]:
    recovery = row.get("recovery_p99_s")
    bound = row.get("recovery_bound_s")
    recovered = "-" if recovery is None else f"{recovery:.2f}" + (f" (<= {bound:.2f})" if bound else "")
    comparison = row.get("tokens", {})
    same = f"{'yes' if comparison.get('identical') else 'NO'} {comparison.get('num_identical', 0)}/" \
           f"{comparison.get('num_compared', 0)} {'ids' if comparison.get('exact_ids') else 'text'}"
    return [row["scenario"], "ok" if row["ok"] else "FAILED", f"{row['num_ok']}/{row['num_failed']}", same,
            _pair(row.get("latency_fault_free", {})), _pair(row.get("latency_faulted", {})), recovered]


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = ["  ".join(name.ljust(width) for name, width in COLUMNS)]
    lines.append("  ".join("-" * width for _, width in COLUMNS))
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, (_, width) in zip(row_cells(row), COLUMNS, strict=True)))
        if row.get("problems"):
            lines.append("    problems: " + "; ".join(row["problems"]))
    return "\n".join(lines)


def render_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def write_json(run: dict[str, Any], directory: str | Path = "results") -> Path:
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / time.strftime("chaos-%Y%m%dT%H%M%SZ.json", time.gmtime())
    path.write_text(json.dumps(run, indent=2, default=str))
    return path
