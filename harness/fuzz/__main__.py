"""`python -m harness.fuzz` (`make fuzz`): hostile traffic against a live local cluster.

Contract: flags become `harness.fuzz.fuzz_runner.FuzzOptions`; the exit code is `fuzz_runner.main`'s (0 only
when every process survived within its memory bound and a normal request still streamed). SIGTERM
unwinds like Ctrl-C, so the cluster's `with` block stops every process it started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from harness.fuzz.fuzz_runner import FuzzOptions, main
from harness.fuzz.loop import TARGETS


def parse(argv: list[str]) -> FuzzOptions:
    parser = argparse.ArgumentParser(prog="python -m harness.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 600)),
                        help="how long to fuzz (default: $FUZZ_SECONDS or 600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32, help="examples drawn per burst")
    parser.add_argument("--warmup", type=float, help="seconds of fuzzing before the RSS baseline (default: 10%%, 3-60 s)")
    parser.add_argument("--rss-bound-mib", type=float, default=64.0, help="allowed RSS growth per process (MiB)")
    parser.add_argument("--target", action="append", choices=TARGETS, help="fuzz only this target (repeatable)")
    parser.add_argument("--results", default="results", help="folder for the JSON ('' for none)")
    args = parser.parse_args(argv)
    return FuzzOptions(seconds=args.seconds, seed=args.seed, batch=args.batch, warmup_s=args.warmup,
                       rss_bound_mib=args.rss_bound_mib, targets=tuple(args.target or TARGETS),
                       results_dir=args.results or None)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(parse(sys.argv[1:])))
