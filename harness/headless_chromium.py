"""Headless Chromium driven over its DevTools pipe, with the standard library only.

Contract:
- `find_chromium() -> str | None`: `$PDBUS_CHROMIUM`, else `/usr/bin/chromium` (Debian's package),
  else `chromium` on PATH; None when there is none.
- `with Chromium(size=(1600, 1200)) as browser:` starts one headless Chromium with a fresh profile
  and flags that keep it off the network (no updates, sync, QUIC, first-run pages);
  `tab = browser.open(url)`; `tab.evaluate(js)` -> the expression's value (JSON-able, awaited when a
  promise); `tab.wait_for(js, timeout_s)` -> its first truthy value (TimeoutError otherwise);
  `tab.screenshot(path, full_page=True)` writes a PNG. Leaving the block closes the browser and
  removes its profile.
Why not `chromium --dump-dom` / `--screenshot`: they capture at the page's load event, and a page
that lives on an EventSource (the dashboard) has nothing to show yet then; `--virtual-time-budget`
waits forever on a stream that never ends. The DevTools protocol over `--remote-debugging-pipe`
(JSON messages ending in NUL on fds 3 and 4) lets the page run for real and be read when ready.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe")


def find_chromium() -> str | None:
    for candidate in (os.environ.get("PDBUS_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class DevToolsPipe:
    """One DevTools connection: commands out, replies in (events are read and dropped)."""

    def __init__(self, commands_fd: int, replies_fd: int) -> None:
        self.commands_fd, self.replies_fd = commands_fd, replies_fd
        self.buffer = b""
        self.last_id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 30.0) -> dict:
        self.last_id += 1
        message: dict[str, Any] = {"id": self.last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.commands_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._next(deadline, method)
            if reply.get("id") == self.last_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _next(self, deadline: float, method: str) -> dict:
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.replies_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no answer to {method}")
            chunk = os.read(self.replies_fd, 1 << 20)
            if not chunk:
                raise EOFError(f"chromium closed its DevTools pipe during {method}")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)


class Tab:
    def __init__(self, pipe: DevToolsPipe, session: str, size: tuple[int, int]) -> None:
        self.pipe, self.session, self.size = pipe, session, size

    def call(self, method: str, params: dict | None = None, timeout_s: float = 30.0) -> dict:
        return self.pipe.call(method, params, self.session, timeout_s)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page threw: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 10.0, interval_s: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still {value!r} after {timeout_s}s")
            time.sleep(interval_s)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        width, height = self.size
        if full_page:   # grow the viewport to the page, so the capture is the whole page
            height = max(height, int(self.evaluate("document.documentElement.scrollHeight")))
            self._viewport(width, height)
            time.sleep(0.3)   # let the page lay out (charts redraw on resize)
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def _viewport(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1, "mobile": False})


class Chromium:
    def __init__(self, size: tuple[int, int] = (1600, 1200), binary: str | None = None) -> None:
        self.size = size
        found = binary or find_chromium()
        if found is None:
            raise FileNotFoundError("no Chromium: apt-get install -y chromium (or set PDBUS_CHROMIUM)")
        self.binary = found
        self.profile = tempfile.mkdtemp(prefix="pdbus-chromium-")
        self.process: subprocess.Popen | None = None
        self.pipe: DevToolsPipe | None = None

    def __enter__(self) -> Chromium:
        commands_read, commands_write = os.pipe()
        replies_read, replies_write = os.pipe()
        # Chromium reads fd 3 and writes fd 4. Move our ends above 9 first, so that the shell's
        # `3<&N 4>&M` never reads an fd it has just replaced (os.pipe may hand out 3 or 4).
        theirs = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands_read, replies_write)]
        for fd in (commands_read, replies_write):
            os.close(fd)
        script = f'exec "$0" "$@" 3<&{theirs[0]} 4>&{theirs[1]} {theirs[0]}<&- {theirs[1]}>&-'
        log = open(Path(self.profile) / "chromium.log", "wb")   # noqa: SIM115 (the child keeps it)
        self.process = subprocess.Popen(
            ["bash", "-c", script, self.binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            pass_fds=theirs, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        for fd in theirs:
            os.close(fd)
        self.pipe = DevToolsPipe(commands_write, replies_read)
        return self

    def open(self, url: str) -> Tab:
        assert self.pipe is not None, "use Chromium as a context manager"
        target = self.pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        tab = Tab(self.pipe, session, self.size)
        tab._viewport(*self.size)
        tab.call("Page.navigate", {"url": url})
        return tab

    def log_tail(self, num_bytes: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return (Path(self.profile) / "chromium.log").read_bytes()[-num_bytes:].decode(errors="replace")
        return ""

    def __exit__(self, *exc: Any) -> None:
        if self.pipe is not None:
            with contextlib.suppress(Exception):
                self.pipe.call("Browser.close", timeout_s=5)
            for fd in (self.pipe.commands_fd, self.pipe.replies_fd):
                os.close(fd)
        if self.process is not None:
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)
