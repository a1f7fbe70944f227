"""`make bench-scale`'s report: a line per point as it is measured, the table and the headline
figures with their targets, the results files and the plots.

Contract:
- `print_row(row)`; `print_table(rows, summary)`.
- `summarize(rows) -> dict`: per path the saturation rate and the row at half of it (of several,
  the one with the median p99; target p99 <= 5 ms); the broker CPU per token, batched /
  per-token, at each node count of the nodes sweep, at saturation and with the broker alone
  (target <= 1/10); the batched broker's ceiling, derived at the saturation point (tokens/s /
  broker CPU fraction: the broker is loaded most there) and measured with the broker alone,
  streams starting and ending (target >= 1,000,000 tokens/s at 64 streams per node); the
  gateway's figures.
- `write_results(out_dir, tag, rows, summary, args) -> [json path, summary path]`:
  <out_dir>/<tag>-<date>.json and <out_dir>/<tag>-summary.json (out_dir: results/ by default).
- `plot(rows, path) -> path`: against nodes (the nodes sweep, one offered rate): tokens/s relayed
  and the broker's ceiling; broker us/token; a colour per path.
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from harness.bench.scale_procs import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results"
P99_TARGET_MS = 5.0
RATIO_TARGET = 0.1
MILLION = 1_000_000
_COLUMNS = (("section", "{}", 8), ("path", "{}", 9), ("transport", "{}", 4), ("nodes", "{}", 5),
            ("streams", "{}", 6), ("step_s", "{:g}", 7), ("nominal_per_s", "{:,.0f}", 9),
            ("tokens_per_s", "{:,.0f}", 9), ("p50_ms", "{:.2f}", 7), ("p99_ms", "{:.2f}", 7),
            ("broker_us_per_token", "{:.2f}", 7), ("broker_cpu_frac", "{:.2f}", 5),
            ("loadgen_cpu_frac", "{:.2f}", 5), ("client_cpu_frac", "{:.2f}", 5),
            ("gateway_cpu_frac", "{:.2f}", 5), ("tokens_per_message", "{:.1f}", 5),
            ("broker_ceiling_tokens_per_s", "{:,.0f}", 10), ("other_cpu_frac", "{:.2f}", 5))
_HEADERS = ("section", "path", "via", "nodes", "strms", "step_s", "offered", "tok/s", "p50ms", "p99ms",
            "brk_us", "brkCPU", "lgCPU", "cliCPU", "gwCPU", "tok/msg", "brk_ceiling", "other")


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "-"
    return fmt.format(value)


def print_row(row: dict) -> None:
    cells = "  ".join(f"{_cell(row, key, fmt):>{width}}" for key, fmt, width in _COLUMNS)
    flags = " saturated" if row.get("saturated") else ""
    flags += f" FAILED: {row['failed'].splitlines()[0]}" if row.get("failed") else ""
    problems = {k: v for k, v in {**row.get("client_counters", {}), **row.get("loadgen_endpoint", {})}.items()
                if k.startswith(("error.", "out_of_order", "stalled", "dropped.send", "failed."))}
    print(cells + flags + (f" {problems}" if problems else ""), flush=True)


def _ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r.get("failed")]


def _pick(rows: list[dict], section: str, path: str, transport: str = "bus") -> list[dict]:
    return [r for r in _ok(rows) if r["section"] == section and r["path"] == path and r["transport"] == transport]


def _brief(row: dict | None) -> dict | None:
    if row is None:
        return None
    keys = ("nodes", "streams", "step_s", "churn_tokens", "broker_net_us_per_token", "broker_idle_cpu_frac", "nominal_per_s", "tokens_per_s", "p50_ms", "p99_ms", "p999_ms",
            "broker_us_per_token", "broker_cpu_frac", "loadgen_cpu_frac", "client_cpu_frac", "gateway_cpu_frac",
            "gateway_us_per_token", "broker_ceiling_tokens_per_s", "tokens_per_message", "other_cpu_frac", "saturated")
    return {k: row[k] for k in keys if k in row}


def _alone(rows: list[dict], path: str) -> dict | None:
    """The broker-alone row with stream churn (the one comparable to a real load)."""
    return next((r for r in _pick(rows, "ceiling", path, "raw") if r.get("churn_tokens")), None)


def _median_p99(rows: list[dict]) -> dict | None:
    ranked = sorted((r for r in rows if r["p99_ms"] is not None), key=lambda r: r["p99_ms"])
    return ranked[(len(ranked) - 1) // 2] if ranked else None


def _usable(row: dict, key: str) -> bool:
    """A figure a ratio can use: measured (tokens flowed), finite and above zero."""
    value = row.get(key)
    return isinstance(value, int | float) and 0 < value < math.inf


def _ratios(rows: list[dict], key: str) -> dict[str, float]:
    """Broker CPU per token, batched / per-token: at each node count of the nodes sweep, at each
    path's saturation point, and with the broker alone (the ceiling section)."""
    ratios = {}
    for batched in _pick(rows, "nodes", "batched"):
        old = next((r for r in _pick(rows, "nodes", "per-token") if r["nodes"] == batched["nodes"]), None)
        if old is not None and _usable(batched, key) and _usable(old, key):
            ratios[f"{batched['nodes']} nodes"] = batched[key] / old[key]
    pairs = {"saturation": [max(_pick(rows, "rate", p), key=lambda r: r["tokens_per_s"], default=None)
                            for p in ("batched", "per-token")],
             "broker alone": [_alone(rows, p) for p in ("batched", "per-token")]}
    for where, (new, per_token) in pairs.items():
        if new and per_token and _usable(new, key) and _usable(per_token, key):
            ratios[where] = new[key] / per_token[key]
    return ratios


def summarize(rows: list[dict]) -> dict:
    paths = ("batched", "per-token")
    saturation = {p: max(_pick(rows, "rate", p), key=lambda r: r["tokens_per_s"], default=None) for p in paths}
    half = {p: _median_p99(_pick(rows, "half", p)) for p in paths}
    ratios = _ratios(rows, "broker_us_per_token")
    alone = {p: _alone(rows, p) for p in paths}
    sat_b = saturation["batched"]
    derived = sat_b["broker_ceiling_tokens_per_s"] if sat_b else None
    measured = alone["batched"]["tokens_per_s"] if alone["batched"] else None
    http = _ok([r for r in rows if r["transport"] == "http"])
    return {
        "machine": machine(),
        "saturation_tokens_per_s": {p: (r["tokens_per_s"] if r else None) for p, r in saturation.items()},
        "at_saturation": {p: _brief(r) for p, r in saturation.items()},
        "at_half_saturation": {p: _brief(r) for p, r in half.items()},
        "half_saturation_p99_ms_each_run": {p: [r["p99_ms"] for r in _pick(rows, "half", p)] for p in paths},
        "broker_alone": alone,
        "broker_alone_no_churn": {p: next((r for r in _pick(rows, "ceiling", p, "raw") if not r.get("churn_tokens")),
                                          None) for p in paths},
        "broker_us_per_token_ratio_batched_over_per_token": ratios,
        "broker_ceiling_tokens_per_s_batched": {"derived_at_saturation": derived, "measured_alone": measured},
        "http": {p: [_brief(r) for r in http if r["path"] == p] for p in paths},
        "targets": {
            "half_saturation_p99_le_5ms": {p: (r["p99_ms"] is not None and r["p99_ms"] <= P99_TARGET_MS) if r else None
                                           for p, r in half.items()},
            "batched_broker_cpu_le_tenth_of_per_token": {where: ratio <= RATIO_TARGET for where, ratio in ratios.items()},
            "one_broker_ge_1M_tokens_per_s_at_64_streams_per_node": {
                "derived_at_saturation": (derived >= MILLION) if derived else None,
                "measured_alone": (measured >= MILLION) if measured else None},
        },
    }


def print_table(rows: list[dict], summary: dict) -> None:
    print("\n" + "  ".join(f"{h:>{w}}" for h, (_, _, w) in zip(_HEADERS, _COLUMNS, strict=True)))
    for row in rows:
        print_row(row)
    print(f"\nmachine: {summary['machine']}")
    for path, rate in summary["saturation_tokens_per_s"].items():
        half = summary["at_half_saturation"][path]
        at_half = f"p50 {half['p50_ms']:.2f} ms, p99 {half['p99_ms']:.2f} ms" if half and half["p99_ms"] else "-"
        print(f"{path:10} saturation {rate or 0:,.0f} tokens/s; at half of it: {at_half}")
    for where, ratio in summary["broker_us_per_token_ratio_batched_over_per_token"].items():
        print(f"broker CPU per token, batched / per-token ({where}): {ratio:.3f} (1/{1 / ratio:.0f})")
    ceiling = summary["broker_ceiling_tokens_per_s_batched"]
    if ceiling["derived_at_saturation"]:
        print(f"broker ceiling, batched: {ceiling['derived_at_saturation']:,.0f} tokens/s derived at saturation "
              "(tokens/s / broker CPU fraction, beside the load processes)")
    if ceiling["measured_alone"]:
        print(f"broker ceiling, batched: {ceiling['measured_alone']:,.0f} tokens/s measured with the broker alone "
              "(bare peers; streams start and end as in the runs)")
    print("targets: " + json.dumps(summary["targets"]))


def write_results(out_dir: Path, tag: str, rows: list[dict], summary: dict, args: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    full = out_dir / f"{tag}-{date}.json"
    meta = {"args": {k: (sorted(v) if isinstance(v, set) else v) for k, v in args.items()}, "date": date}
    full.write_text(json.dumps({**meta, "summary": summary, "rows": rows}, indent=1, default=str))
    brief = out_dir / f"{tag}-summary.json"
    brief.write_text(json.dumps({**meta, **summary}, indent=1, default=str))
    return [full, brief]


def plot(rows: list[dict], path: Path) -> Path:
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = ((axes[0], (("tokens_per_s", "relayed", "-"), ("broker_ceiling_tokens_per_s", "broker ceiling", "--")),
               "tokens/s"),
              (axes[1], (("broker_us_per_token", "", "-"),), "broker CPU per token (us)"))
    for axis, series, label in panels:
        for name, color in (("batched", "tab:blue"), ("per-token", "tab:orange")):
            for key, what, style in series:
                points = sorted((r["nodes"], r[key]) for r in _pick(rows, "nodes", name) if r.get(key))
                if points:
                    axis.plot(*zip(*points, strict=True), style, marker="o", color=color,
                              label=f"{name} {what}".strip())
        if axis.get_lines():
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_xticks(sorted({r["nodes"] for r in _pick(rows, "nodes", "batched")}))
            axis.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            axis.legend(fontsize=7)
        axis.set_xlabel("decode nodes (64 streams each), one offered rate")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    figure.suptitle(f"token plane through one broker ({machine()})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
