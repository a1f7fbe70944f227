"""The gateway's /dashboard in a browser, and load to show on it (the browser test and
harness/dashboard_screenshots.py).

Contract:
- `STATE_JS`: a JavaScript expression the page answers with what it shows: `snapshots` (how many
  it drew), `status` (its stream's state), `nodes` ([id, role, state] per row), `charts` (per
  chart, the seconds that hold a value and a non-zero one), `incidents` and `transfers` (rows).
- `CHARTS_FILLED_JS`, `failover_shown_js(node_id)`: true once the throughput, TTFT and TPOT charts
  hold non-zero values; once `node_id` shows as lost with a failover and its `node_lost` event.
- `open_dashboard(browser, url, min_snapshots)`: a tab on `url` once the page drew that many
  snapshots (headless_chromium.Chromium).
- `Load(url, model, concurrency)`: threads that send streaming completions to the gateway until
  `stop()` (a context manager); `num_done`, `num_failed` count them.
- `fail_over(url, model, kill)`: one long streaming completion whose decode node is killed
  (`kill(node_id)`) after its first tokens, read to its end: a failover for certain, whatever the
  load's streams happen to be doing; returns the final chunk's `pdbus` object.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx

from harness.headless_chromium import Chromium, Tab

STATE_JS = """(() => ({
  snapshots: Number(document.body.dataset.snapshots || 0),
  status: document.getElementById("status").dataset.state,
  nodes: [...document.querySelectorAll("#nodes tr[data-node]")].map(
    (r) => [r.dataset.node, r.dataset.role, r.dataset.state]),
  charts: Object.fromEntries([...document.querySelectorAll(".chart")].map(
    (c) => [c.id, [Number(c.dataset.points || 0), Number(c.dataset.nonzero || 0)]])),
  incidents: [...document.querySelectorAll("#incidents tr[data-kind]")].map((r) => r.dataset.kind),
  transfers: document.querySelectorAll("#transfers tr[data-transfer]").length,
}))()"""


CHARTS_FILLED_JS = f"""(() => {{ const c = {STATE_JS}.charts;
  return c["chart-throughput"][1] > 0 && c["chart-ttft"][1] > 0 && c["chart-tpot"][1] > 0; }})()"""


def failover_shown_js(node_id: str) -> str:
    return f"""(() => {{ const s = {STATE_JS};
  return s.nodes.some((n) => n[0] === {json.dumps(node_id)} && n[2] === "lost")
    && s.incidents.includes("node_lost") && s.incidents.includes("failover"); }})()"""


def open_dashboard(browser: Chromium, url: str, min_snapshots: int = 2, timeout_s: float = 15.0) -> Tab:
    tab = browser.open(url)
    tab.wait_for(f"Number(document.body && document.body.dataset.snapshots || 0) >= {min_snapshots}", timeout_s)
    return tab


class Load:
    """Streaming completions at a fixed concurrency until stopped (greedy, a fixed length)."""

    def __init__(self, url: str, model: str, concurrency: int = 2, max_tokens: int = 48,
                 api_key: str | None = None) -> None:
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.num_done = self.num_failed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(concurrency)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _loop(self, index: int) -> None:
        with httpx.Client(timeout=60, headers=self.headers) as client:
            number = 0
            while not self._stop.is_set():
                number += 1
                body = {"model": self.model, "prompt": f"Request {index}-{number}: once upon a time " * 3,
                        "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                        "session_id": f"load-{index}-{number}"}
                try:
                    self._one(client, body)
                    self.num_done += 1
                except (httpx.HTTPError, ValueError):
                    self.num_failed += 1

    def _one(self, client: httpx.Client, body: dict) -> None:
        with client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: {") and "error" in json.loads(line[6:]):
                    raise ValueError("the stream ended with an error")


def fail_over(url: str, model: str, kill: Callable[[str], None], api_key: str | None = None,
              max_tokens: int = 200) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"model": model, "prompt": "A long story, interrupted:", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    info: dict = {}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as response:
        response.raise_for_status()
        serving, num_chunks = response.headers["X-Pdbus-Decode-Node"], 0
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            num_chunks += 1
            if num_chunks == 3:
                kill(serving)
            info = chunk.get("pdbus", info)
    if not info.get("failover"):
        raise AssertionError(f"the stream on {serving} did not fail over: {info}")
    return info
