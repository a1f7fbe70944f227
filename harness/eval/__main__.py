"""`python -m harness.eval`: see harness/eval/eval_runner.py."""

import sys

from harness.eval.eval_runner import main

sys.exit(main())
