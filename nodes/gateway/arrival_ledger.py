"""SLO outcomes by *arrival* time: how the requests that arrived in each second fared, for the
planner to judge a layout of the pools by the requests that arrived while it served
(docs/API.md, `GET /slo/arrivals`; docs/CLUSTER.md rule 7). Pure: no sockets, no clock of its own.

Contract: `ledger = ArrivalLedger(window_s=600, max_requests=100_000)`;
- `arrival = ledger.arrived(now)`: an admitted request (an `Arrival` handle);
  `arrival.token(now)` for each of its tokens as it reaches the gateway (its TTFT and TPOT are
  read from them); `arrival.end(now, counted, served)` once it ended (later calls are ignored):
  `counted` False for an ending that says nothing of the cluster (the client went away or sent a
  bad request): it leaves the counts; `served` False for a failure the cluster caused
  (overloaded, unavailable, an error).
- `ledger.outcomes(now, ttft_s, tpot_s) -> list[SecondCounts]`: per whole second of the gateway's
  clock in which requests still kept arrived, oldest first: `within` (ended, served, first token
  within `ttft_s` and TPOT within `tpot_s`; a target <= 0 is not checked), `missed` (a target
  broken: served too slowly, failed by the cluster, still waiting for a first token longer than
  `ttft_s`, or streaming at a mean time per token so far over `tpot_s`), `pending` (not yet
  known). A request without any token is judged by its whole duration against `ttft_s`. A stream
  judged missed by its pace so far may end within: each answer is the latest word. `credit`: the
  sum over the second's judged requests of the share of the targets each met, 1 within, else
  min(1, ttft_s / its TTFT) x min(1, tpot_s / its TPOT) (so far, for one still waiting or
  streaming; 0 for a failure), which still tells layouts apart when nothing meets its SLO.
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
    served: bool = False          # ended with the cluster's answer (not a failure)
    counted: bool = True

    def token(self, now: float) -> None:
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        self.num_tokens += 1

    def end(self, now: float, counted: bool, served: bool) -> None:
        if self.ended_at is None:
            self.ended_at, self.counted, self.served = now, counted, served


@dataclass(frozen=True, slots=True)
class SecondCounts:
    second: int
    within: int
    missed: int
    pending: int
    credit: float   # within count 1 each, missed the share of the targets met (below), pending 0


class ArrivalLedger:
    def __init__(self, window_s: float = 600.0, max_requests: int = 100_000) -> None:
        self.window_s, self.max_requests = window_s, max_requests
        self._arrivals: deque[Arrival] = deque()

    def arrived(self, now: float) -> Arrival:
        arrival = Arrival(now)
        self._arrivals.append(arrival)
        self._prune(now)
        return arrival

    def outcomes(self, now: float, ttft_s: float, tpot_s: float) -> list[SecondCounts]:
        self._prune(now)
        counts: dict[int, list[int]] = {}
        credits: dict[int, float] = {}
        for arrival in self._arrivals:
            if not arrival.counted:
                continue
            second = math.floor(arrival.at)
            kind, credit = _verdict(arrival, now, ttft_s, tpot_s)
            counts.setdefault(second, [0, 0, 0])[kind] += 1
            credits[second] = credits.get(second, 0.0) + credit
        return [SecondCounts(second, within, missed, pending, round(credits[second], 6))
                for second, (within, missed, pending) in counts.items()]

    def __len__(self) -> int:
        return len(self._arrivals)

    def _prune(self, now: float) -> None:
        while self._arrivals and (self._arrivals[0].at < now - self.window_s
                                  or len(self._arrivals) > self.max_requests):
            self._arrivals.popleft()


WITHIN, MISSED, PENDING = 0, 1, 2


def _verdict(arrival: Arrival, now: float, ttft_s: float, tpot_s: float) -> tuple[int, float]:
    """(WITHIN, MISSED or PENDING, its credit): a stream still running is judged by its pace so far,
    so a slow layout shows at once; a request still waiting, by how long it has waited."""
    if arrival.ended_at is not None and not arrival.served:
        return MISSED, 0.0
    first = arrival.first_at if arrival.first_at is not None else arrival.ended_at
    waited = (first if first is not None else now) - arrival.at
    credit = _share(ttft_s, waited) * _share(tpot_s, _pace(arrival))   # so far, for a stream still running
    if credit < 1.0:
        return MISSED, credit
    return (WITHIN, 1.0) if arrival.ended_at is not None else (PENDING, 0.0)


def _share(target: float, measured: float | None) -> float:
    """1 within the target (or without a target or a measure), else the fraction of it met."""
    return 1.0 if target <= 0 or measured is None or measured <= target else target / measured


def _pace(arrival: Arrival) -> float | None:
    """The mean time per token after the first (TPOT), None with fewer than two tokens."""
    if arrival.num_tokens < 2 or arrival.first_at is None or arrival.last_at is None:
        return None
    return (arrival.last_at - arrival.first_at) / (arrival.num_tokens - 1)
