"""How every kernel is compiled: numba's decorators with the kernels' options, and a disk cache
that cannot go stale.

Contract (only where `kernels.cpu.probe().numba`): `njit(f)` compiles f on its first call per
argument types (no bounds checks, GIL released, fast-math limited to reassociation and
contraction), `njit_numpy_errors(f)` the same with numpy's error model, `inline(f)` a helper
inlined into the kernels that call it, `njit_plain(f)` / `njit_plain_numpy_errors(f)` /
`inline_plain(f)` the same without fast-math (for kernels whose results must match a numpy
reference bit for bit). `FASTMATH` is that flag set.

The disk cache: numba keys a cached kernel on its own file's timestamp, not on the helpers it
inlines from other files, so editing a helper could leave a stale kernel in `__pycache__`. Here
every kernel's cache lives under one directory named by a hash of all the package's sources
(`cache_dir()`): an edit anywhere in the package starts a fresh cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodes.engines.kernels.cpu import probe

NUMBA = probe().numba   # every kernel needs it
FASTMATH = {"reassoc", "contract"}   # vectorised float32 reductions, FMA; no unsafe NaN/inf folding
PACKAGE = Path(__file__).resolve().parent


def source_hash() -> str:
    """sha256 (16 hex digits) of every .py file of the kernels package, by relative path."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def cache_dir() -> Path:
    """Where compiled kernels are cached: `$PDBUS_KERNEL_CACHE` (default ~/.cache/pdbus/kernels)
    / the sources' hash. Set as numba's cache directory before the first kernel compiles."""
    root = Path(os.environ.get("PDBUS_KERNEL_CACHE", "") or Path.home() / ".cache" / "pdbus" / "kernels")
    path = root / source_hash()
    import numba
    numba.config.CACHE_DIR = str(path)
    return path


def _compiler(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    def decorate(function: Callable[..., Any]) -> Any:
        if not probe().numba:
            return function   # never called: dispatch sends every operation to torch
        # numba's cache directory is cache_dir() already: set when this module loaded.
        import numba
        return numba.njit(**options)(function)
    return decorate


if NUMBA:
    cache_dir()   # before any kernel module decorates a cached function

njit = _compiler(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH)
njit_numpy_errors = _compiler(cache=True, boundscheck=False, nogil=True, fastmath=FASTMATH, error_model="numpy")
inline = _compiler(inline="always", boundscheck=False, fastmath=FASTMATH)
njit_plain = _compiler(cache=True, boundscheck=False, nogil=True)
njit_plain_numpy_errors = _compiler(cache=True, boundscheck=False, nogil=True, error_model="numpy")
inline_plain = _compiler(inline="always", boundscheck=False)
