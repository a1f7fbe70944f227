"""`make bench-kernels`: does each compiled CPU kernel still beat torch.compile of the path it replaced?

Contract: for each dtype's plan on this CPU (`kernels.dispatch.plan("bfloat16" | "float32", "cpu")`)
and each operation in `kernel_cases.OPERATIONS`, the kernel the plan selects is timed against
torch's own path for the same operation (what LlamaRunner or TorchQuantizer runs without the kernel)
compiled with `torch.compile` (inductor freezing; mode "max-autotune-no-cudagraphs" for the linear
layers, the default elsewhere), on SmolLM2-135M's shapes, in one process. An operation the plan
gives to torch here (AMX kernels on a CPU without AMX, say) is skipped with its reason. Before any
timing each pair's outputs are compared (bf16 within a few ulps of the output's scale, float32
within 2**-13 of it, int8 codes within 1); a pair that disagrees is reported and not timed.

Timing: `--rounds` paired rounds (default 7), the kernel and torch one after the other in each,
taking turns at going first; a round times each side over enough back-to-back calls to last
~0.1 s. A shared machine's speed drifts between rounds but hardly within one, so the figure is the
median of the per-round ratios, gain = torch time / kernel time (> 1: the kernel is faster). The
µs columns are the medians of the per-call times. Verdict: "keeps its place" at a gain of at least
`KEEP_GAIN` (1.2x), else "DELETE: below 1.2x": a kernel is code to keep correct on every CPU, and
below that it does not pay for it (a linear kernel's op rows below it defer to its decode step).

The linear kernels get a second row per step size (kernel_steps): a whole decode step of the
engine with the kernel against the same step with its linear layers on the engine's own torch path
(not compiled), since that is what would serve in a deleted kernel's place. "torch µs" is compiled
torch's time, or that step's on those rows.

Reading it: a row is one call of the shape in its `shape` column (decode-sized calls run several
layers, so that they read from memory as a decode step does); a kernel serving several shapes has a
verdict for each (the linear kernels at 1-row and 8-row steps), and one that loses at some shapes
only is a case for narrowing its plan rather than deleting it. The table covers this CPU's plans
only: rerun on each CPU family the engine serves. Verdicts within ~10% of 1.2x can flip between
runs on a shared machine; rerun before acting on one. The first run of a torch version spends
minutes compiling (inductor caches the results on disk).

Threads: 1 torch thread by default (`--threads N`), as the engine runs one per process here; the
kernels are single-threaded. `--quick`: smaller shapes and rounds (for tests). `--only OP` runs one
operation, `--dtype` one plan. Prints a table; writes JSON to `results/kernels-<UTC time>.json`
(`--out-dir`). Run under `flock /tmp/pdbus-bench.lock`, as every benchmark here.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

import torch

from harness.bench import kernel_cases as cases
from harness.bench import kernel_steps
from harness.bench.kernel_torch import inductor_settings
from nodes.engines.kernels import dispatch
from nodes.engines.kernels.cpu import probe

KEEP_GAIN = 1.2
DTYPES = ("bfloat16", "float32")
ROUND_SECONDS = {False: 0.1, True: 0.01}   # per side and round: full, --quick
MAX_CALLS = 100_000


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"


def header(threads: int, rounds: int) -> str:
    cpu = probe()
    features = cpu.as_log()
    flags = [name for name, value in features.items() if value is True]
    masked = f", masked {list(cpu.masked)}" if cpu.masked else ""
    return (f"# kernel_bench: {cpu_model()} | features: {' '.join(flags) or 'none'}{masked} | "
            f"torch {torch.__version__}, {threads} thread(s), {rounds} paired rounds")


def verdict(case: cases.Case, gain: float) -> str:
    """A linear kernel below the bar against compiled torch still has its decode step to answer for
    (kernel_steps): the step row decides whether it goes."""
    if gain >= KEEP_GAIN:
        return "keeps its place"
    if case.operation == "linear" and not case.whole_step:
        return f"below {KEEP_GAIN}x: its decode step decides"
    return f"DELETE: below {KEEP_GAIN}x"


def _per_call(fn, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def calls_for(fn, seconds: float) -> int:
    """Calls that last about `seconds`, from one call after a warm-up call (caches, allocations)."""
    fn()
    return max(1, min(MAX_CALLS, math.ceil(seconds / max(_per_call(fn, 1), 1e-9))))


class Timed(TypedDict):
    """What `paired_rounds` measures of one pair."""
    kernel_us: float
    torch_us: float
    gain: float
    ratios: list[float]
    kernel_calls: int
    torch_calls: int


def paired_rounds(kernel: Callable[[], object], reference: Callable[[], object], rounds: int,
                  seconds: float) -> Timed:
    """Per-call seconds of each side in each round, taking turns at going first (neither always
    runs on the caches and clock the other left), and the median of the per-round ratios."""
    sides: list[tuple[Callable[[], object], int, list[float]]] = [
        (kernel, calls_for(kernel, seconds), []), (reference, calls_for(reference, seconds), [])]
    for r in range(rounds):
        for fn, calls, times in sides if r % 2 == 0 else sides[::-1]:
            times.append(_per_call(fn, calls))
    kernel_times, torch_times = sides[0][2], sides[1][2]
    ratios = [t / k for k, t in zip(kernel_times, torch_times, strict=True)]
    return {"kernel_us": statistics.median(kernel_times) * 1e6, "torch_us": statistics.median(torch_times) * 1e6,
            "gain": statistics.median(ratios), "ratios": ratios,
            "kernel_calls": sides[0][1], "torch_calls": sides[1][1]}


def measure(case: cases.Case, rounds: int, seconds: float) -> dict[str, object]:
    row: dict[str, object] = {"operation": case.operation, "module": case.module, "dtype": case.dtype,
                              "shape": case.shape}
    error = case.check()   # compiles both sides too: nothing below times a compile
    if error is not None:
        return row | {"kernel_us": None, "torch_us": None, "gain": None, "verdict": f"MISMATCH: {error}"}
    timed = paired_rounds(case.kernel, case.reference, rounds, seconds)
    return row | timed | {"verdict": verdict(case, timed["gain"])}


def run(dtypes: list[str], operations: list[str], sizes: cases.Sizes, rounds: int,
        seconds: float) -> tuple[list[dict], list[dict]]:
    rows, skipped = [], []
    for dtype in dtypes:
        plan = dispatch.plan(dtype, "cpu")
        for operation in operations:
            items = cases.build(operation, dtype, plan, sizes)
            if operation == "linear":   # and the step the engine would run without the kernel
                items += kernel_steps.step_cases(dtype, plan, sizes)
            for item in items:
                if isinstance(item, cases.Skip):
                    skipped.append({"operation": item.operation, "dtype": item.dtype, "reason": item.reason})
                else:
                    rows.append(measure(item, rounds, seconds))
                    print(f"# {_line(rows[-1])}", flush=True)   # progress: compiles take a while
    return rows, skipped


COLUMNS = ("operation", "module", "dtype", "shape", "kernel µs", "torch µs", "gain", "verdict")


def _line(row: dict) -> str:
    def number(value, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"
    gain = "-" if row["gain"] is None else f"{row['gain']:.2f}x"
    cells = (row["operation"], row["module"], row["dtype"], row["shape"], number(row["kernel_us"], 1),
             number(row["torch_us"], 1), gain, row["verdict"])
    return "| " + " | ".join(str(c) for c in cells) + " |"


def print_table(title: str, rows: list[dict], skipped: list[dict], seconds: float) -> None:
    print(title)
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print(_line(row))
    for skip in skipped:
        print(f"skipped: {skip['operation']} ({skip['dtype']}): {skip['reason']}")
    print(f"# {len(rows)} pairs in {seconds:.0f} s")


def write_json(out_dir: Path, report: dict) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"kernels-{stamp}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.kernel_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, help="paired rounds (default 7, --quick 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the engine runs)")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, shorter rounds")
    parser.add_argument("--only", choices=sorted(cases.OPERATIONS), help="one operation")
    parser.add_argument("--dtype", choices=DTYPES, help="one dtype's plan (default both)")
    parser.add_argument("--out-dir", type=Path, default=Path("results"), help="where the JSON goes")
    parser.add_argument("--rows", type=lambda v: tuple(int(r) for r in v.split(",")),
                        help="the linear layers' step rows, comma-separated (default 1,2,8)")
    return parser


def bench(args: argparse.Namespace) -> dict[str, object]:
    """Runs the pairs and prints the table; returns the JSON report."""
    rounds = args.rounds or (3 if args.quick else 7)
    title = header(args.threads, rounds)
    print(title, flush=True)
    started = time.perf_counter()
    dtypes = [args.dtype] if args.dtype else list(DTYPES)
    with inductor_settings(), torch.no_grad():   # inference, as the engine runs (freezing needs it too)
        sizes = cases.QUICK if args.quick else cases.FULL
        rows, skipped = run(dtypes, [args.only] if args.only else list(cases.OPERATIONS),
                            replace(sizes, rows=args.rows) if args.rows else sizes, rounds, ROUND_SECONDS[args.quick])
    seconds = time.perf_counter() - started
    print_table(title, rows, skipped, seconds)
    return {"cpu": cpu_model(), "features": probe().as_log(), "torch": torch.__version__,
            "plans": {d: dispatch.plan(d, "cpu").as_log() for d in dtypes}, "threads": args.threads,
            "rounds": rounds, "quick": args.quick, "keep_gain": KEEP_GAIN, "seconds": seconds,
            "rows": rows, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        report = bench(args)
    finally:   # a caller in the same process (the test) keeps its own thread count
        torch.set_num_threads(threads)
    print(f"# wrote {write_json(args.out_dir, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
