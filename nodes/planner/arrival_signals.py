"""The gateway's SLO outcomes by second of arrival (`GET /slo/arrivals`, docs/API.md) read for the
planner, on the planner's clock.

Contract (pure but for the state of `ArrivalReader`):
- `arrivals_url(metrics_url, targets) -> str | None`: the gateway's `/slo/arrivals` beside its
  `/metrics`, asking for the (TTFT, TPOT) targets in seconds; None without a target or when the
  URL does not end in `/metrics`.
- `ArrivalReader().read(text, now) -> tuple[ArrivalCount, ...] | None`: the body as counts whose
  `at` is on the caller's clock (`now` when the answer came). The gateway's clock is mapped by an
  offset fixed at the first answer and kept while answers agree with it within `MAX_DRIFT_S` (so a
  second keeps one `at` from answer to answer); a larger jump (a restarted gateway elsewhere)
  takes a new offset. What a peer sent is checked: a body that is not JSON of the documented
  shape is None; a row that is not four whole numbers >= 0 (counts bounded) is skipped; at most
  `MAX_ROWS` rows are read. Never raises.
"""

from __future__ import annotations

import json
import math
from urllib.parse import urlencode

from scheduler.planner_signals import ArrivalCount

MAX_ROWS = 100_000
MAX_COUNT = 2**32
MAX_DRIFT_S = 1.0


def arrivals_url(metrics_url: str, targets: tuple[float, float]) -> str | None:
    if not any(t > 0 for t in targets) or not metrics_url.endswith("/metrics"):
        return None
    query = urlencode({"ttft_s": f"{max(0.0, targets[0]):g}", "tpot_s": f"{max(0.0, targets[1]):g}"})
    return f"{metrics_url.removesuffix('/metrics')}/slo/arrivals?{query}"


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class ArrivalReader:
    def __init__(self) -> None:
        self.offset: float | None = None   # the caller's clock minus the gateway's

    def read(self, text: str, now: float) -> tuple[ArrivalCount, ...] | None:
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(body, dict):
            return None
        gateway_now, rows = body.get("now"), body.get("seconds")
        if not isinstance(gateway_now, int | float) or isinstance(gateway_now, bool) \
                or not math.isfinite(gateway_now) or not isinstance(rows, list):
            return None
        offset = now - float(gateway_now)
        if self.offset is None or abs(offset - self.offset) > MAX_DRIFT_S:
            self.offset = offset
        return tuple(ArrivalCount(row[0] + self.offset, row[1], row[2]) for row in rows[:MAX_ROWS]
                     if isinstance(row, list) and len(row) == 4 and _whole(row[0], -2**63, 2**63)
                     and all(_whole(n, 0, MAX_COUNT) for n in row[1:]))
