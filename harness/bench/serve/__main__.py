"""`python -m harness.bench.serve [flags]`: the serving benchmark (see `harness.bench.serve.cli`)."""

import sys

from harness.bench.serve.cli import run

sys.exit(run())
