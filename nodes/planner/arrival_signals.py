"""The gateway's SLO outcomes by second of arrival (`GET /slo/arrivals`, docs/API.md) read for the
planner, on the planner's clock.

Contract (pure but for the state of `ArrivalReader`):
- `arrivals_url(metrics_url, targets) -> str | None`: the gateway's `/slo/arrivals` beside its
  `/metrics`, asking for the (TTFT, TPOT) targets in seconds; None without a target or when the
  URL does not end in `/metrics`.
- `ArrivalReader().read(text, now) -> tuple[ArrivalCount, ...] | None`: the body as counts whose
  `at` is on the caller's clock (`now` when the answer came); a row without its fifth element
  (credit) counts its misses as earning nothing. The gateway's clock is mapped by an offset fixed
  at the first answer and kept while answers agree with it within `MAX_DRIFT_S` (so a second keeps
  one `at` from answer to answer); a larger jump (a restarted gateway elsewhere) takes a new
  offset. What a peer sent is checked: a body that is not JSON of the documented shape is None; a
  row that is not a second and three whole counts >= 0 (bounded), then a credit within [within,
  within + missed], is skipped; at most `MAX_ROWS` rows are read. Never raises.
"""

from __future__ import annotations

import json
import math
from urllib.parse import urlencode

from scheduler.planner_signals import ArrivalCount

MAX_ROWS = 100_000
MAX_COUNT = 2**32
MAX_DRIFT_S = 1.0
CREDIT_SLACK = 1e-3   # the gateway rounds each second's credit


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
        offset = self.offset
        return tuple(count for row in rows[:MAX_ROWS] if (count := _count(row, offset)) is not None)


def _count(row: object, offset: float) -> ArrivalCount | None:
    if not isinstance(row, list) or len(row) not in (4, 5) or not _whole(row[0], -2**63, 2**63) \
            or not all(_whole(n, 0, MAX_COUNT) for n in row[1:4]):
        return None
    second, within, missed = row[0], row[1], row[2]
    credit = row[4] if len(row) == 5 else within   # a gateway without credit: misses earn nothing
    if not isinstance(credit, int | float) or isinstance(credit, bool) \
            or not within - CREDIT_SLACK <= credit <= within + missed + CREDIT_SLACK:   # NaN fails too
        return None
    return ArrivalCount(second + offset, within, missed, float(max(within, min(credit, within + missed))))
