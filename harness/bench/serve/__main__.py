"""`python -m harness.bench.serve [flags]`: the serving benchmark (see `harness.bench.serve.serve_cli`)."""

import sys

from harness.bench.serve.serve_cli import run

sys.exit(run())
