"""Pure functions behind `make eval`'s table: per-item scores, paired differences, exactness, layout.

Contract (no lm-eval, no torch; numpy only):
- `item_scores(samples, metric, filter_name) -> dict[doc_id, float]`: one run's per-item values of a
  metric, read from lm-eval's logged samples (`log_samples=True`: each sample has `doc_id`,
  `filter` and the metric's value).
- `paired_difference(a, b, *, level, num_resamples, seed) -> PairedDiff`: the mean of b - a over
  the items both runs scored, with a paired bootstrap percentile interval (items resampled
  together, so only the items where the runs disagree move it); `num_b_only` / `num_a_only`
  count the items only b / only a got right (McNemar's discordant pairs). Identical runs give
  exactly [0, 0]. Deterministic for a seed.
- `same_responses(a, b) -> (num_equal, num_items)`: how many items have bit-equal raw responses
  (loglikelihoods, generated texts) in two runs' logged samples, matched by doc_id.
- `loglikelihood_gap(a, b) -> float | None`: the largest |difference| between two runs' log-likelihoods
  of the same (item, choice); None when they share no log-likelihood response.
- `format_table(rows, columns) -> str`: a fixed-width text table, `None` printed as `-`.
- `score_rows(runs, metrics, ...)`: the rows of the table: task, metric, each run's score, and
  `int8 - raw` with its interval, from a dict of run name -> {task: (results, samples)}.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BOOTSTRAP_RESAMPLES = 10_000
CI_LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class PairedDiff:
    mean: float          # mean of b - a over the paired items
    low: float           # the interval's ends, at `level`
    high: float
    level: float
    num_items: int
    num_b_only: int      # items where b scored higher than a (for 0/1 metrics: only b right)
    num_a_only: int

    def describe(self) -> str:
        return (f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] "
                f"({self.num_b_only}+/{self.num_a_only}- of {self.num_items})")


def item_scores(samples: Iterable[Mapping[str, Any]], metric: str, filter_name: str = "none") -> dict[int, float]:
    scores = {}
    for sample in samples:
        if sample.get("filter", "none") == filter_name and metric in sample:
            scores[int(sample["doc_id"])] = float(sample[metric])
    return scores


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], *, level: float = CI_LEVEL,
                      num_resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> PairedDiff:
    items = sorted(set(a) & set(b))
    if not items:
        raise ValueError("the two runs share no scored item")
    diffs = np.array([b[i] - a[i] for i in items], dtype=np.float64)
    num_b_only, num_a_only = int((diffs > 0).sum()), int((diffs < 0).sum())
    if num_b_only == num_a_only == 0:
        return PairedDiff(0.0, 0.0, 0.0, level, len(items), 0, 0)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(num_resamples, len(diffs)))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDiff(float(diffs.mean()), float(low), float(high), level, len(items), num_b_only, num_a_only)


def same_responses(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(items whose raw responses are equal in both runs, items in both), by doc_id (a task with
    several filters logs one sample per filter, all with the same responses)."""
    def keyed(samples: Iterable[Mapping[str, Any]]) -> dict[int, Any]:
        return {int(s["doc_id"]): _plain(s.get("resps")) for s in samples}

    left, right = keyed(a), keyed(b)
    common = set(left) & set(right)
    return sum(left[k] == right[k] for k in common), len(common)


def loglikelihood_gap(a: Iterable[Mapping[str, Any]], b: Iterable[Mapping[str, Any]]) -> float | None:
    def scores(samples: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], float]:
        out = {}
        for sample in samples:
            for choice, resp in enumerate(_plain(sample.get("resps")) or ()):
                if resp and isinstance(resp[0], tuple) and isinstance(resp[0][0], float):
                    out[(int(sample["doc_id"]), choice)] = resp[0][0]
        return out

    left, right = scores(a), scores(b)
    common = set(left) & set(right)
    return max(abs(left[k] - right[k]) for k in common) if common else None


def _plain(value: Any) -> Any:
    """Responses as nested tuples of plain values (lm-eval logs tuples, lists and numpy scalars)."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def score_rows(runs: Mapping[str, Mapping[str, tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]],
               metrics: Sequence[tuple[str, str, str]], columns: Sequence[str],
               diff: tuple[str, str] | None = ("cluster raw", "cluster int8"), seed: int = 0) -> list[list[Any]]:
    """One row per (task, metric, filter): the task, `metric` (`metric,filter` unless filter is
    "none"), each column's score (None where that run lacks it), then diff[1] - diff[0] with its
    interval (None where either lacks it). `runs[column][task]` is (lm-eval results[task], samples)."""
    rows = []
    for task, metric, filter_name in metrics:
        key = f"{metric},{filter_name}"
        row: list[Any] = [task, metric if filter_name == "none" else f"{metric} ({filter_name})"]
        for column in columns:
            results = runs.get(column, {}).get(task)
            row.append(None if results is None or key not in results[0] else float(results[0][key]))
        if diff is not None:
            row.append(_diff_cell(runs, task, metric, filter_name, diff, seed))
        rows.append(row)
    return rows


def _diff_cell(runs: Mapping[str, Any], task: str, metric: str, filter_name: str, diff: tuple[str, str],
               seed: int) -> str | None:
    base, other = runs.get(diff[0], {}).get(task), runs.get(diff[1], {}).get(task)
    if base is None or other is None:
        return None
    a, b = item_scores(base[1], metric, filter_name), item_scores(other[1], metric, filter_name)
    return paired_difference(a, b, seed=seed).describe() if set(a) & set(b) else None


def format_table(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> str:
    cells = [list(columns)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
