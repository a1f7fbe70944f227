"""`pdbus bench`: the serving benchmark — pdbus disaggregated vs colocated vs vLLM over the OpenAI
streaming API, with `vllm bench serve`'s metrics and DistServe's SLO attainment.

The flags, presets and output are `harness.bench.serve.serve_cli`'s (`make bench`, `make bench-quick`).
Run it under the shared benchmark lock: `flock /tmp/pdbus-bench.lock pdbus bench --quick`.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.bench.serve.serve_cli import add_arguments as add_bench_arguments
    add_bench_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from harness.bench.serve.serve_cli import main as bench_main
    return bench_main(args)
