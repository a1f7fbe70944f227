"""The docs describe the tree as it is: every repository path that docs/*.md and README.md name
exists, every `make` target they name is in the Makefile, and every results file BENCHMARKS.md
cites as a figure's evidence is committed (results/ is ignored, so such files are force-added)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
CODE_PATH = re.compile(r"(?<![\w/.])((?:bus|nodes|scheduler|config|harness|tests|docs|\.ci)/[A-Za-z0-9_./\-*]+)")
RESULTS_PATH = re.compile(r"`((?:results/[A-Za-z0-9_./\-]+)|[A-Za-z0-9_.\-]+\.(?:json|txt|png))`")   # bare: in results/
MAKE_TARGET = re.compile(r"`make ([a-z0-9\-]+)")


def tracked() -> set[str]:
    """Every file git tracks or would (untracked, not ignored), and every folder above one."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return set(files) | {str(parent) for f in files for parent in PurePosixPath(f).parents}


def named(pattern: re.Pattern[str], docs: list[Path]) -> list[tuple[str, int, str]]:
    return [(doc.name, number, match.group(1).rstrip(".,:;)/"))
            for doc in docs for number, line in enumerate(doc.read_text().splitlines(), 1)
            for match in pattern.finditer(line)]


@pytest.fixture(scope="module")
def tree() -> set[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    return tracked()


def exists(path: str, tree: set[str]) -> bool:
    """A file or folder of the tree; a module named without its `.py` (`bus/broker`); a glob
    (`tests/harness/test_eval*.py`) that matches something."""
    if "*" in path:
        return any(fnmatch.fnmatch(name, path) for name in tree)
    return path in tree or f"{path}.py" in tree


def test_every_code_path_the_docs_name_exists(tree):
    missing = [(doc, n, path) for doc, n, path in named(CODE_PATH, DOCS) if not exists(path, tree)]
    assert not missing, f"docs name paths that are not in the tree (doc, line, path): {missing}"


def test_every_results_file_benchmarks_cites_is_committed(tree):
    cited = named(RESULTS_PATH, [ROOT / "docs" / "BENCHMARKS.md"])
    assert cited
    missing = [(n, path) for _, n, path in cited
               if (path if path.startswith("results/") else f"results/{path}") not in tree]
    assert not missing, f"BENCHMARKS.md cites uncommitted results (line, path): {missing}; git add -f them"


def test_every_make_target_the_docs_name_is_in_the_makefile():
    targets = set(re.findall(r"^([A-Za-z0-9_.\-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))
    missing = [(doc, n, target) for doc, n, target in named(MAKE_TARGET, DOCS) if target not in targets]
    assert not missing, f"docs name make targets the Makefile lacks (doc, line, target): {missing}"
