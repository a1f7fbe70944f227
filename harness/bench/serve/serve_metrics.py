"""Metrics of one measured run, with `vllm bench serve`'s definitions and JSON key names, plus
DistServe's SLO attainment.

Contract (pure):
- `summarize(results, duration_s, percentiles=(50, 90, 99), goodput=None, slo=None)` -> dict with
  vLLM's keys: `duration`, `completed`, `failed`, `total_input_tokens`, `total_output_tokens`,
  `request_throughput`, `request_goodput` (when `goodput` is given), `output_throughput`,
  `total_token_throughput`, and for each of `ttft`, `tpot`, `itl`, `e2el`:
  `mean_<m>_ms`, `median_<m>_ms`, `std_<m>_ms`, `p<P>_<m>_ms` (P as vLLM writes it: 99, 99.9).
  Definitions (as vLLM's, successful requests only): TTFT = send -> first token; TPOT =
  (E2E - TTFT) / (output tokens - 1) over requests with > 1 output token; ITL = every gap
  between consecutive token chunks of every request; E2EL = send -> end. Throughputs divide
  by `duration` (first send -> last completion). Goodput (`--goodput ttft:MS tpot:MS e2el:MS`)
  = completed requests meeting every given bound, per second (TPOT counts as 0 for 1 token).
- `slo` (an `Slo`): `slo_attainment` = requests meeting their kind's TTFT bound and the TPOT
  bound / all requests sent (failures miss), DistServe's measure; also per kind.
- `stage_means(results)`: mean pdbus stage timings (ms) from the final chunks' `pdbus` objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.bench.serve.load_generator import RequestResult

METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
STAGES = ("plan_s", "queue_s", "prefill_s", "kv_transfer_s", "kv_wait_s", "decode_queue_s", "ttft_s")


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: dict[str, float] = field(default_factory=dict)   # by request kind; "*" = any other
    tpot_ms: float = float("inf")

    def ttft_bound_ms(self, kind: str) -> float:
        return self.ttft_ms.get(kind, self.ttft_ms.get("*", float("inf")))

    def met(self, result: RequestResult) -> bool:
        return (result.success and result.ttft * 1000 <= self.ttft_bound_ms(result.kind)
                and tpot(result) * 1000 <= self.tpot_ms)


MIXED_SLO = Slo(ttft_ms={"chat": 2000.0, "document": 6000.0, "*": 2000.0}, tpot_ms=100.0)


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:2000", "tpot:100"]` -> {"ttft": 2000.0, "tpot": 100.0} (milliseconds)."""
    bounds = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in GOODPUT_KEYS or not value:
            raise ValueError(f"--goodput takes {'/'.join(GOODPUT_KEYS)}:MS pairs, got {item!r}")
        bounds[name] = float(value)
        if bounds[name] <= 0:
            raise ValueError(f"--goodput bound must be > 0 ms, got {item!r}")
    return bounds


def tpot(result: RequestResult) -> float:
    return (result.latency - result.ttft) / (result.output_tokens - 1) if result.output_tokens > 1 else 0.0


def percentile_name(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    values = np.asarray(values_s, dtype=float) * 1000 if len(values_s) else np.zeros(1)
    stats = {f"mean_{name}_ms": float(values.mean()), f"median_{name}_ms": float(np.median(values)),
             f"std_{name}_ms": float(values.std())}
    stats.update({f"p{percentile_name(p)}_{name}_ms": float(np.percentile(values, p)) for p in percentiles})
    return stats


def _is_good(result: RequestResult, bounds: dict[str, float]) -> bool:
    measured = {"ttft": result.ttft, "tpot": tpot(result), "e2el": result.latency}
    return all(measured[k] * 1000 <= bound for k, bound in bounds.items())


def summarize(results: Sequence[RequestResult], duration_s: float, percentiles: Sequence[float] = (50, 90, 99),
              goodput: dict[str, float] | None = None, slo: Slo | None = None) -> dict:
    ok = [r for r in results if r.success]
    duration = max(duration_s, 1e-9)
    total_in, total_out = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    summary: dict = {"duration": duration_s, "completed": len(ok), "failed": len(results) - len(ok),
                     "total_input_tokens": total_in, "total_output_tokens": total_out,
                     "request_throughput": len(ok) / duration}
    if goodput:
        summary["request_goodput"] = sum(_is_good(r, goodput) for r in ok) / duration
    summary["output_throughput"] = total_out / duration
    summary["total_token_throughput"] = (total_in + total_out) / duration
    timelines = {"ttft": [r.ttft for r in ok], "tpot": [tpot(r) for r in ok if r.output_tokens > 1],
                 "itl": [gap for r in ok for gap in r.itl], "e2el": [r.latency for r in ok]}
    for name in METRICS:
        summary.update(_stats(name, timelines[name], percentiles))
    if slo is not None:
        summary.update(slo_attainment(results, slo))
    summary["errors"] = sorted({r.error for r in results if r.error})[:10]
    return summary


def slo_attainment(results: Sequence[RequestResult], slo: Slo) -> dict:
    kinds = sorted({r.kind for r in results})
    by_kind = {k: [r for r in results if r.kind == k] for k in kinds}
    met = sum(slo.met(r) for r in results)
    return {"slo_attainment": met / len(results) if results else 0.0, "num_slo_met": met,
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "slo_attainment_by_kind": {k: sum(slo.met(r) for r in rs) / len(rs) for k, rs in by_kind.items()}}


def stage_means(results: Sequence[RequestResult]) -> dict[str, float]:
    timed = [r.pdbus.get("timings", {}) for r in results if r.success and r.pdbus]
    return {f"mean_{stage[:-2]}_ms": float(np.mean([t.get(stage, 0.0) for t in timed])) * 1000
            for stage in STAGES} if timed else {}


def highest_rate_meeting(rates_attainment: Sequence[tuple[float, float]], target: float = 0.9) -> float | None:
    """The highest measured rate whose attainment is >= target (DistServe's per-GPU rate, on a grid)."""
    passing = [rate for rate, attained in rates_attainment if attained >= target]
    return max(passing) if passing else None
