"""One child process of the launcher: started in its own process group with PR_SET_PDEATHSIG
(`die_with_parent`: it dies with its parent, even a SIGKILLed one), its stderr lines parsed
(`parse_line`: a JSON log event, or None) and queued for the supervisor (nodes/launcher.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodes.launch_plan import ChildSpec

_PR_SET_PDEATHSIG = 1


_prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here: no dlopen after fork


def die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGTERM it if its parent (this process) dies first.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """One child process; a thread parses its stderr lines into the supervisor's queue."""

    def __init__(self, spec: ChildSpec, argv: tuple[str, ...], lines: queue.Queue) -> None:
        self.spec = spec
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, errors="replace", preexec_fn=die_with_parent,
                                        process_group=0, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reported_exit = False
        self._reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._reader.start()

    def _read(self, lines: queue.Queue) -> None:
        assert self.process.stderr is not None   # opened with stderr=PIPE
        for line in self.process.stderr:
            lines.put((self, line.rstrip("\n")))

    def finish_reading(self, timeout: float = 2.0) -> None:
        """Wait until the exited child's last lines are queued."""
        self._reader.join(timeout)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, number: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):   # it exited just now
                self.process.send_signal(number)


def parse_line(line: str) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
