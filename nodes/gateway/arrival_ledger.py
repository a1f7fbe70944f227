"""SLO outcomes by *arrival* time: how the requests that arrived in each second fared, for the
planner to judge a layout of the pools by the requests that arrived while it served
(docs/API.md, `GET /slo/arrivals`; docs/CLUSTER.md rule 7). Pure: no sockets, no clock of its own.

Contract: `ledger = ArrivalLedger(window_s=600, max_requests=100_000)`;
- `arrival = ledger.arrived(now)`: an admitted request (an `Arrival` handle);
  `arrival.token(now)` for each of its tokens as it reaches the gateway;
  `ledger.ended(arrival, now, counted, served, tpot_s)`: it ended; `counted` False for an ending
  that says nothing of the cluster (the client went away or sent a bad request): it leaves the
  counts; `served` False for a failure the cluster caused (overloaded, unavailable, an error);
  `tpot_s` its mean time per output token after the first (None with fewer than two tokens).
- `ledger.outcomes(now, ttft_s, tpot_s) -> list[SecondCounts]`: per whole second of the gateway's
  clock in which requests still kept arrived, oldest first: `within` (ended, served, first token
  within `ttft_s` and TPOT within `tpot_s`; a target <= 0 is not checked), `missed` (a target
  broken: served too slowly, failed by the cluster, still waiting for a first token longer than
  `ttft_s`, or streaming at a mean time per token so far over `tpot_s`), `pending` (not yet
  known). A request without any token is judged by its whole duration against `ttft_s`. A stream
  judged missed by its pace so far may end within: each answer is the latest word.
Bounds: arrivals older than `window_s` are dropped, and past `max_requests` the oldest are, so
memory and the cost of `outcomes` stay bounded under any load.
Why by arrival: the gateway's histograms observe a request when it ends, so after a switch of
layout they are full of requests queued under the layout before it; the planner would blame the
new layout for the old one's backlog.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class Arrival:
    at: float
    first_at: float | None = None
    last_at: float | None = None
    num_tokens: int = 0
    ended_at: float | None = None
    tpot_s: float | None = None
    served: bool = False          # ended with the cluster's answer (not a failure)
    counted: bool = True

    def token(self, now: float) -> None:
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_tokens += 1


@dataclass(frozen=True, slots=True)
class SecondCounts:
    second: int
    within: int
    missed: int
    pending: int


class ArrivalLedger:
    def __init__(self, window_s: float = 600.0, max_requests: int = 100_000) -> None:
        self.window_s, self.max_requests = window_s, max_requests
        self._arrivals: deque[Arrival] = deque()

    def arrived(self, now: float) -> Arrival:
        arrival = Arrival(now)
        self._arrivals.append(arrival)
        self._prune(now)
        return arrival

    @staticmethod
    def ended(arrival: Arrival, now: float, counted: bool, served: bool, tpot_s: float | None = None) -> None:
        if arrival.ended_at is not None:
            return
        arrival.ended_at, arrival.counted, arrival.served = now, counted, served
        arrival.tpot_s = tpot_s if tpot_s is not None and math.isfinite(tpot_s) else None

    def outcomes(self, now: float, ttft_s: float, tpot_s: float) -> list[SecondCounts]:
        self._prune(now)
        counts: dict[int, list[int]] = {}
        for arrival in self._arrivals:
            if not arrival.counted:
                continue
            slot = counts.setdefault(math.floor(arrival.at), [0, 0, 0])
            slot[_verdict(arrival, now, ttft_s, tpot_s)] += 1
        return [SecondCounts(second, *slot) for second, slot in counts.items()]

    def __len__(self) -> int:
        return len(self._arrivals)

    def _prune(self, now: float) -> None:
        while self._arrivals and (self._arrivals[0].at < now - self.window_s
                                  or len(self._arrivals) > self.max_requests):
            self._arrivals.popleft()


WITHIN, MISSED, PENDING = 0, 1, 2


def _verdict(arrival: Arrival, now: float, ttft_s: float, tpot_s: float) -> int:
    first = arrival.first_at if arrival.first_at is not None else arrival.ended_at
    if ttft_s > 0 and (first if first is not None else now) - arrival.at > ttft_s:
        return MISSED   # past the TTFT target already, whatever happens next
    if arrival.ended_at is None:
        pace = _pace(arrival)   # streams are judged by their pace so far: a slow layout shows at once
        return MISSED if tpot_s > 0 and pace is not None and pace > tpot_s else PENDING
    if not arrival.served:
        return MISSED
    if tpot_s > 0 and arrival.tpot_s is not None and arrival.tpot_s > tpot_s:
        return MISSED
    return WITHIN


def _pace(arrival: Arrival) -> float | None:
    if arrival.num_tokens < 2 or arrival.first_at is None or arrival.last_at is None:
        return None
    return (arrival.last_at - arrival.first_at) / (arrival.num_tokens - 1)
