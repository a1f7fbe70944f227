"""SLO signals for the planner: TTFT and TPOT p90 over a recent window, read from the gateway's
Prometheus `/metrics` (docs/CLUSTER.md "The planner", `[planner] gateway_metrics_url`).

Contract:
- `histogram(text, name) -> dict[float, float] | None` (pure): the cumulative bucket counts of the
  unlabelled histogram `name` (`<name>_bucket{le="..."}` lines; `+Inf` is `math.inf`), or None when
  the text has no such series. Other lines, and lines it cannot read, are skipped.
- `window_quantile(old, new, q) -> float | None` (pure): the q-quantile of the observations made
  between two scrapes of one histogram, from the bucket deltas, interpolated inside the bucket as
  Prometheus's `histogram_quantile` does (a quantile in the `+Inf` bucket is the highest finite
  bound). A bucket that went down means the gateway restarted: `new` alone is the window. None
  when nothing was observed in between (no traffic: no evidence either way).
- `window_fraction_within(old, new, limit) -> float | None` (pure): the share of the observations
  between two scrapes that were <= `limit`, interpolated inside its bucket as above (past the
  highest finite bound: only what the finite buckets hold counts). None when nothing was observed.
- `fetch_text(url, timeout_s) -> str | None`: one GET; None on any failure. Never raises.
- `SloSignals(url, window_s, timeout_s, clock, fetch, targets)`: a callable for the planner shell's
  `signals` hook. Each call scrapes once and returns `Signals(slo_attainment, ttft_p90_s,
  tpot_p90_s)` over the scrapes of the last `window_s` (the newest against the latest one at
  least `window_s` old, or the oldest kept while the window is young); a field is None while
  unknown. A failed scrape
  gives `Signals()` and is logged once per outage (`planner_slo_unavailable`). Never raises.
  `targets` = (TTFT, TPOT) targets in seconds (0: none): `slo_attainment` is then estimated as the
  product of the window's shares within each set target, and `arrivals` read from the gateway's
  `/slo/arrivals` (nodes/planner/arrival_signals.py; None when it cannot be read, logged once per
  outage as `planner_slo_arrivals_unavailable`), fetched beside `/metrics` on a worker thread so a
  silent gateway costs one `timeout_s` a round. The gateway's histograms are per
  metric, not per request, so the product assumes the two independent: an estimate the planner
  uses only to compare layouts under the same traffic.
- `gateway_metrics_url(settings, workers=None) -> str | None`: the cluster's own gateway's
  `/metrics`, from `[gateway]` (`workers` overrides its `workers`; a wildcard host is reached on
  loopback; `tls_cert` set: https, which a self-signed certificate makes fail: no signals). None when it cannot be one source: port 0
  (unknown until bound) or several workers (each counts only its own requests, docs/API.md).
The gateway observes a request's TTFT and TPOT when its stream ends, so the window trails the
requests it describes by their decode time.
"""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from bus.log import get_logger
from nodes.planner.arrival_signals import ArrivalReader, arrivals_url
from scheduler.planner_signals import ArrivalCount, Signals

TTFT = "pdbus_time_to_first_token_seconds"
TPOT = "pdbus_time_per_output_token_seconds"
QUANTILE = 0.9
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
_BUCKET = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{le="(?P<le>[^"]+)"\}\s+(?P<value>\S+)')
log = get_logger("planner")


def histogram(text: str, name: str) -> dict[float, float] | None:
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if match is None or match["name"] != name:
            continue
        try:
            bound, count = float(match["le"]), float(match["value"])
        except ValueError:
            continue
        if math.isfinite(count) and count >= 0 and not math.isnan(bound):
            buckets[bound] = count
    return buckets if math.inf in buckets else None


def window_quantile(old: Mapping[float, float] | None, new: Mapping[float, float], q: float) -> float | None:
    bounds, counts = _window_counts(old, new)
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    for index, (bound, count) in enumerate(zip(bounds, counts, strict=True)):
        if count >= rank:
            return _inside(bounds, counts, index, rank) if math.isfinite(bound) else _highest_finite(bounds)
    return _highest_finite(bounds)


def _window_counts(old: Mapping[float, float] | None, new: Mapping[float, float]) -> tuple[list[float], list[float]]:
    """The sorted bounds and the cumulative counts observed since `old` (`new` alone after a restart)."""
    bounds = sorted(new)
    restarted = old is None or any(new[b] < old.get(b, 0.0) for b in bounds)
    return bounds, [new[b] - (0.0 if restarted or old is None else old.get(b, 0.0)) for b in bounds]


def window_fraction_within(old: Mapping[float, float] | None, new: Mapping[float, float],
                           limit: float) -> float | None:
    bounds, counts = _window_counts(old, new)
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    within, lower, below = 0.0, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if not math.isfinite(bound):
            break
        if limit >= bound:
            within, lower, below = count, bound, count
            continue
        within = below + (count - below) * (limit - lower) / (bound - lower) if bound > lower else below
        break
    return min(1.0, max(0.0, within / total))


def _inside(bounds: list[float], counts: list[float], index: int, rank: float) -> float:
    """Linear interpolation inside bucket `index`, as `histogram_quantile` does (lower edge 0 first)."""
    lower, below = (bounds[index - 1], counts[index - 1]) if index else (0.0, 0.0)
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return bounds[index]
    return lower + (bounds[index] - lower) * (rank - below) / in_bucket


def _highest_finite(bounds: list[float]) -> float | None:
    finite = [b for b in bounds if math.isfinite(b)]
    return finite[-1] if finite else None


def fetch_text(url: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:   # noqa: S310 (a configured URL)
            return str(response.read().decode("utf-8", "replace"))
    except Exception:   # unreachable, refused, timed out, a bad URL: the planner runs on without signals
        return None


@dataclass(frozen=True, slots=True)
class Scrape:
    at: float
    ttft: dict[float, float] | None
    tpot: dict[float, float] | None


class SloSignals:
    def __init__(self, url: str, window_s: float = 30.0, timeout_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 fetch: Callable[[str, float], str | None] = fetch_text,
                 targets: tuple[float, float] = (0.0, 0.0)) -> None:
        self.url, self.window_s, self.timeout_s, self.clock, self.fetch = url, window_s, timeout_s, clock, fetch
        self.targets = targets
        self.scrapes: deque[Scrape] = deque()
        self.available = True
        self.arrivals_url = arrivals_url(url, targets)
        self.arrivals = ArrivalReader()
        self.arrivals_available = True
        # The two routes are fetched at once: a gateway that does not answer costs a round one
        # timeout, not two. One worker thread, started at the first round that needs it.
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="planner-arrivals")

    def __call__(self) -> Signals:
        try:
            return self._signals()
        except Exception:   # a bug here must cost the signals, never the planner's round
            log.exception("planner_slo_failed", url=self.url)
            return Signals()

    def _signals(self) -> Signals:
        pending = self._fetch_arrivals()
        text = self.fetch(self.url, self.timeout_s)
        arrivals = self._arrivals(pending)   # a route of its own: read even when /metrics fails
        if text is None:
            if self.available:
                log.warning("planner_slo_unavailable", url=self.url)
            self.available = False
            return Signals(arrivals=arrivals)
        self.available = True
        newest = Scrape(self.clock(), histogram(text, TTFT), histogram(text, TPOT))
        self._keep(newest)
        if len(self.scrapes) < 2:   # one scrape is no window: its counts span the gateway's whole life
            return Signals(arrivals=arrivals)
        base = self.scrapes[0]
        return Signals(slo_attainment=self._attainment(base, newest), ttft_p90_s=_quantile(base.ttft, newest.ttft),
                       tpot_p90_s=_quantile(base.tpot, newest.tpot), arrivals=arrivals)

    def _fetch_arrivals(self) -> Future[str | None] | None:
        if self.arrivals_url is None:
            return None
        return self._beside.submit(self.fetch, self.arrivals_url, self.timeout_s)

    def _arrivals(self, pending: Future[str | None] | None) -> tuple[ArrivalCount, ...] | None:
        if pending is None:
            return None
        text = pending.result()
        arrivals = self.arrivals.read(text, self.clock()) if text is not None else None
        if arrivals is None and self.arrivals_available:
            log.warning("planner_slo_arrivals_unavailable", url=self.arrivals_url)
        self.arrivals_available = arrivals is not None
        return arrivals

    def _attainment(self, base: Scrape, newest: Scrape) -> float | None:
        shares = [window_fraction_within(old, new, target)
                  for old, new, target in ((base.ttft, newest.ttft, self.targets[0]),
                                           (base.tpot, newest.tpot, self.targets[1]))
                  if target > 0 and old is not None and new is not None]
        known = [share for share in shares if share is not None]
        return math.prod(known) if known else None

    def _keep(self, newest: Scrape) -> None:
        """Keep the newest scrape and, as the window's base, the latest one at least `window_s` old."""
        self.scrapes.append(newest)
        start = newest.at - self.window_s
        while len(self.scrapes) > 2 and self.scrapes[1].at <= start:
            self.scrapes.popleft()


def _quantile(old: dict[float, float] | None, new: dict[float, float] | None) -> float | None:
    if new is None or old is None:   # the series is missing from one scrape: no window to read
        return None
    return window_quantile(old, new, QUANTILE)


def gateway_metrics_url(settings: Mapping[str, object], workers: int | None = None) -> str | None:
    gateway = settings.get("gateway", {})
    gateway = gateway if isinstance(gateway, Mapping) else {}
    host, port = gateway.get("host", "127.0.0.1"), gateway.get("port", 8000)
    workers = workers if workers is not None else gateway.get("workers", 1)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536 or workers != 1:
        return None
    host = "127.0.0.1" if host in WILDCARD_HOSTS or not isinstance(host, str) else host
    scheme = "https" if gateway.get("tls_cert") else "http"
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
