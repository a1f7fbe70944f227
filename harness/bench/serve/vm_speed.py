"""How fast this machine multiplies, probed before and after each system of a serve sweep: the
systems run one after another, and a VM's rate can move 2-3x within minutes (docs/BENCHMARKS.md),
which moves a ratio between two systems as much as any change of theirs.

Contract: `probe() -> {"bf16_tflops", "fp32_tflops"}` (one thread, 1024^3, best of a few rounds:
harness/bench/core_share.py's product; a second or two, torch imported on first use);
`drift(rows) -> float | None` is the largest over the smallest bf16 rate any row's `vm_speed`
holds (None: no probes); `text(rows)` the lines the report prints, with a warning when the drift
exceeds `DRIFT` (ratios between the systems of that run are then not comparable).
"""

from __future__ import annotations

from harness.bench.core_share import matmul_tflops

DRIFT = 1.25


def probe() -> dict[str, float]:
    return {"bf16_tflops": round(matmul_tflops("bfloat16"), 3), "fp32_tflops": round(matmul_tflops("float32"), 3)}


def _rates(row: dict) -> list[float]:
    speed = row.get("vm_speed") or {}
    return [probe["bf16_tflops"] for probe in (speed.get("before"), speed.get("after")) if probe]


def drift(rows: list[dict]) -> float | None:
    rates = [rate for row in rows for rate in _rates(row)]
    return max(rates) / min(rates) if rates and min(rates) > 0 else None


def text(rows: list[dict]) -> str:
    lines = ["VM matmul rate, one thread, bf16 TFLOP/s before -> after each system:"]
    seen = set()
    for row in rows:
        rates = _rates(row)
        if len(rates) == 2 and row["system"] not in seen:
            seen.add(row["system"])
            lines.append(f"  {row['system']}: {rates[0]:.2f} -> {rates[1]:.2f}")
    spread = drift(rows)
    if spread is None:
        return ""
    if spread > DRIFT:
        lines.append(f"  the rate moved {spread:.2f}x during the sweep (> {DRIFT}x): ratios between systems "
                     "of this run measure the VM as much as the systems")
    return "\n".join(lines)
