"""The tables `make bench-kv` prints from its end-to-end figures, and the targets it judges.

Contract: results are `run_end_to_end`'s (harness/bench/kv_bench.py): case -> (best seconds, wire
ratio, median seconds, per-round seconds); `raw_bytes` maps a source dtype to its bytes.
- `paired_ratio(results, key, base)`: median over rounds of key's time / base's in the same round;
- `print_end_to_end(title, results, raw_bytes)`: best, median, GB/s and wire ratio per case;
- `print_targets(loop, shaped, auto_pairs, auto_rounds)`: every target of issue 3 as a ratio of two
  figures of this run, met or MISSED (auto / none: the auto pass's rows, harness/bench/kv_auto.py);
- `print_null_pairs(loop, shaped)`: auto / none beside none again / none, medians with quartiles;
- `print_curve_cost(results, raw_bytes)`: plain vs CURVE seconds per case (`curve_cost`'s).
All print markdown tables to stdout.
"""

from __future__ import annotations

import statistics

from harness.bench.kv_auto import AUTO_BASES, AUTO_GOAL, auto_row


def paired_ratio(results: dict, key: str, base: str) -> float:
    """Median over rounds of `key`'s time / `base`'s time in the same round. Why not a ratio of
    two bests: the two cases differ by a percent or less, while the best of N of one case moves by
    10-20 % between runs of this VM; each round runs both within a few ms of each other, so their
    ratio in a round cancels the machine's drifts, and the median discards the rounds a burst hit."""
    return statistics.median(a / b for a, b in zip(results[key][3], results[base][3], strict=True))


def print_end_to_end(title: str, results: dict, raw_bytes: dict) -> None:
    print(f"\n### End to end, {title} (best of N; GB/s of the engine's KV)\n")
    print("| case | ms (best) | ms (median) | GB/s (best) | wire ratio |\n|---|---:|---:|---:|---:|")
    for key, (seconds, ratio, median, _) in results.items():
        print(f"| {key} | {seconds * 1e3:.1f} | {median * 1e3:.1f} | {raw_bytes[key.split()[0]] / seconds / 1e9:.2f} "
              f"| {ratio:.2f}x |")


def target(label: str, value: float, goal: float) -> str:
    """A target row for an at-least goal."""
    return f"| {label} | {value:.2f} | >= {goal} | {'met' if value >= goal else 'MISSED'} |"


def print_null_pairs(loop: dict, shaped: dict) -> None:
    """auto / none beside none again / none: how far two runs of the same case drift apart."""
    print("\n### auto / none against a null pair (`none` twice in the same round), medians of per-round ratios "
          "(quartiles)\n\n| link, case | auto / none | none again / none |\n|---|---:|---:|")
    for name, results in (("loopback", loop), ("10 Gbit/s", shaped)):
        for base in AUTO_BASES:
            cells = []
            for twin in ("auto", "none again"):
                ratios = [a / b for a, b in zip(results[f"{base}+{twin}"][3], results[f"{base}+none"][3], strict=True)]
                low, mid, high = statistics.quantiles(ratios, n=4)
                cells.append(f"{mid:.3f} ({low:.3f}–{high:.3f})")
            print(f"| {name}, {base} | {' | '.join(cells)} |")


def print_targets(loop: dict, shaped: dict, auto_pairs: dict, auto_rounds: int) -> None:
    def t(results, key):
        return results[key][0]
    rows = [
        target("loopback: fp32 raw+none / int8+auto time", t(loop, "fp32 raw+none") / t(loop, "fp32 int8+auto"), 1.3),
        target("loopback: bf16 raw+none / int8+auto time", t(loop, "bf16 raw+none") / t(loop, "bf16 int8+auto"), 1.0),
        target("10 Gbit/s: fp32 raw+none / int8+auto time", t(shaped, "fp32 raw+none") / t(shaped, "fp32 int8+auto"), 3.0),
        target("10 Gbit/s: bf16 raw+none / int8+auto time", t(shaped, "bf16 raw+none") / t(shaped, "bf16 int8+auto"), 1.8),
    ]
    for name, results in (("loopback", loop), ("10 Gbit/s", shaped)):
        for base in AUTO_BASES:
            # The figure is the auto pass's (its own table says why); the end-to-end table's is beside it.
            interval, mid, said = auto_row(auto_pairs, name, base)
            rows.append(f"| {name}: {base} auto / none time, median of {auto_rounds} paired rounds (95 % interval "
                        f"{interval}; end-to-end table: {paired_ratio(results, f'{base}+auto', f'{base}+none'):.3f}) "
                        f"| {mid:.3f} | <= {AUTO_GOAL} | {said} |")
    rows.append(target("loopback: fp32 raw+none throughput / bare pyzmq",
                       t(loop, "fp32 bare pyzmq") / t(loop, "fp32 raw+none"), 0.8))
    rows.append(target("loopback: bf16 raw+none throughput / bare pyzmq",
                       t(loop, "bf16 bare pyzmq") / t(loop, "bf16 raw+none"), 0.8))
    print("\n### Targets (ratios of best-of-N times from this run; auto / none: the auto pass's medians of "
          "per-round ratios)"
          "\n\n| target | measured | goal | |\n|---|---:|---|---|")
    print("\n".join(rows))


def print_curve_cost(results: dict, raw_bytes: dict) -> None:
    print("\n### CURVE cost on the KV data plane (loopback, two processes, best of N, interleaved)\n")
    print("| case | plain ms | CURVE ms | CURVE/plain time | CURVE GB/s |\n|---|---:|---:|---:|---:|")
    for case, (plain, curve) in results.items():
        print(f"| {case} | {plain * 1e3:.1f} | {curve * 1e3:.1f} | {curve / plain:.2f}x "
              f"| {raw_bytes[case.split()[0]] / curve / 1e9:.2f} |")
