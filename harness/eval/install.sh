#!/usr/bin/env bash
# `make install-eval`: .venv-eval, lm-eval on top of the project's .venv.
#
# .venv-eval is a venv of the same interpreter whose site-packages opens .venv's (one .pth line:
# site.addsitedir), so it sees pdbus, torch 2.13.0 and everything else .venv holds, and pip counts
# them as installed: lm-eval (with its [api] extra, for the OpenAI-server models) and the packages
# it adds (datasets, evaluate, scikit-learn, tenacity, ...) land in .venv-eval alone, and no second
# torch is ever fetched. .venv itself is not changed.
# Usage: harness/eval/install.sh [BASE_VENV=.venv] [EVAL_VENV=.venv-eval]; LM_EVAL_VERSION overrides 0.4.13.
set -euo pipefail
base=${1:-.venv}
eval_venv=${2:-.venv-eval}
version=${LM_EVAL_VERSION:-0.4.13}

test -x "$base/bin/python" || { echo "install-eval: $base/bin/python is missing; run \`make install\` first" >&2; exit 1; }
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
test -x "$eval_venv/bin/python" || "$base/bin/python" -m venv "$eval_venv"
echo '*' > "$eval_venv/.gitignore"   # git never sees it (as Python 3.13's venv does by itself)
eval_site=$("$eval_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$(cd "$base_site" && pwd)')" > "$eval_site/_pdbus_base_venv.pth"

"$eval_venv/bin/python" -m pip install -q --upgrade pip
"$eval_venv/bin/python" -m pip install -q "lm_eval[api]==$version"   # [api]: local-completions' aiohttp/tenacity side
# The layering must hold: torch and transformers from .venv, lm-eval from .venv-eval.
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$eval_venv/bin/python" - "$base_site" <<'PY'
import sys
from pathlib import Path

import lm_eval, torch, transformers, nodes  # noqa: E401
base = Path(sys.argv[1]).resolve()
for module in (torch, transformers):
    assert base in Path(module.__file__).resolve().parents, f"{module.__name__} does not come from {base}"
from importlib.metadata import version
print(f"lm-eval {version('lm_eval')} in .venv-eval, on torch {torch.__version__} and transformers "
      f"{transformers.__version__} from {base}")
PY
