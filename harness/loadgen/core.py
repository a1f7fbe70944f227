"""One load-generator decode node, sans I/O: admission, steps, tokens and FINALs, with no engine,
no sockets and no clock of its own (every call takes `now`).

Contract:
- `LoadGenCore(node_id, step_s, max_batch, next_step_at, stamp=Stamp.NONE, vocab_size=512,
  final_window_s=1.0)`: `next_step_at` is when its first step is due.
- `admit(request_id, body, now) -> Admitted | Refusal`: `body` is a decode REQUEST's body as the
  bus delivered it. A body that does not parse is refused with the code `wire.from_wire` gives
  (`bad_request`, `rejected`: what the gateway's readiness probe expects of a live decode node);
  with `max_batch` streams running it is `full`. Admitted: `plan` is the local plan PARTIAL's
  map (`wire.PlanBody.local(node_id)`), to send before any token of the stream.
- `cancel(request_id) -> bool`: the stream stops (CANCEL, or an ERROR the broker sent for it);
  idempotent; False when it was not running.
- `step(now) -> Step | None`: None before `next_step_at`. Otherwise one `wire.TokenBody` map for
  every running stream (`Step.tokens`: one `reply_batch`, or one `reply` each on the old path),
  then the `wire.DecodeDoneBody` map of each stream that reached its `max_tokens` in this step
  (`Step.finals`, sent after the tokens). A stream admitted after a step gets its first token at
  the next one. Steps are due every `step_s`; a node more than one step behind (its process was
  starved) does one step now and counts it in `counters["steps.late"]`, never a burst to catch up:
  the offered rate then drops, which is what a saturation sweep looks for.
- `stamp`: `none` — maps exactly as the real decode node sends them; `field` — each token map
  also carries `sent_at` (time.monotonic() of the step: the same clock in every process on Linux),
  which the real client ignores; `text` — the token's text is `<sent_at>` (`format_stamp`), so it
  survives the gateway into SSE chunks (`read_stamps` finds it there).
The FINAL repeats the tokens of the last `final_window_s` as nodes/decode_jobs.done_body does
(the replay window: heartbeat expiry + interval, 1 s by default), its usage counts them all.
They are rebuilt from their indices (plain text, never a stamp), and when each was sent is read
from the node's own recent step times, so a stream costs no memory per token.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from nodes import wire

STAMP_FIELD = "sent_at"
PLAIN_TEXT = " tok"
_STAMP_RE = re.compile(r"<(\d+\.\d+)>")


class Stamp(StrEnum):
    NONE = "none"
    FIELD = "field"
    TEXT = "text"


def format_stamp(sent_at: float) -> str:
    return f"<{sent_at:.6f}>"


def read_stamps(text: str) -> list[float]:
    """Every send time stamped in `text` (an SSE chunk may carry one token's text, or several)."""
    return [float(found) for found in _STAMP_RE.findall(text)]


def token_id(index: int, vocab_size: int) -> int:
    return (index * 31 + 7) % vocab_size   # deterministic: a test can check every id


@dataclass(frozen=True, slots=True)
class Admitted:
    plan: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Step:
    tokens: list[tuple[str, dict[str, Any]]]   # (request id, token map), one per running stream
    finals: list[tuple[str, dict[str, Any]]]   # (request id, done map), after the tokens


@dataclass(slots=True)
class _Stream:
    max_tokens: int
    num_prompt: int
    admitted_at: float
    first_step: int = -1          # the node's step number that sent its token 0
    first_token_at: float | None = None
    num_sent: int = 0


@dataclass
class LoadGenCore:
    node_id: str
    step_s: float
    max_batch: int
    next_step_at: float
    stamp: Stamp = Stamp.NONE
    vocab_size: int = 512
    final_window_s: float = 1.0   # the FINAL repeats tokens sent this recently (the replay window)
    running: dict[str, _Stream] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("steps", "steps.late", "tokens", "admitted", "refused.full", "refused.bad_request",
         "finished", "cancelled", "max_batch_seen"), 0))

    def __post_init__(self) -> None:
        assert self.step_s > 0 and self.max_batch > 0, "a step takes time and holds a stream"
        self.bounds = wire.Bounds(vocab_size=self.vocab_size)
        self.num_steps = 0
        self.recent_steps: deque[tuple[int, float]] = deque()   # (step number, time) within final_window_s

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- requests ------------------------------------------------------------------------
    def admit(self, request_id: str, body: Any, now: float) -> Admitted | Refusal:
        try:
            request = wire.from_wire(wire.DecodeRequestBody, body, self.bounds)
        except wire.Refused as refused:
            self.counters["refused.bad_request"] += 1
            return Refusal(refused.code, refused.reason)
        if request_id in self.running:   # the bus never delivers a request id twice; a peer might
            self.counters["refused.bad_request"] += 1
            return Refusal(wire.Code.BAD_REQUEST, "that request id is already streaming here")
        if len(self.running) >= self.max_batch:
            self.counters["refused.full"] += 1
            return Refusal(wire.Code.FULL, f"{self.max_batch} streams running")
        self.running[request_id] = _Stream(request.sampling.max_tokens, len(request.prompt), now)
        self.counters["admitted"] += 1
        return Admitted(wire.to_wire(wire.PlanBody.local(self.node_id)))

    def cancel(self, request_id: str) -> bool:
        if self.running.pop(request_id, None) is None:
            return False
        self.counters["cancelled"] += 1
        return True

    # -- steps ---------------------------------------------------------------------------
    def step(self, now: float) -> Step | None:
        if now < self.next_step_at:
            return None
        self.next_step_at += self.step_s
        if self.next_step_at <= now:   # starved for more than a step: no burst to catch up
            self.counters["steps.late"] += 1
            self.next_step_at = now + self.step_s
        self._remember_step(now)
        tokens: list[tuple[str, dict[str, Any]]] = []
        finals: list[tuple[str, dict[str, Any]]] = []
        for request_id, stream in self.running.items():
            tokens.append((request_id, self._token(stream, now)))
            if stream.num_sent == stream.max_tokens:
                finals.append((request_id, self._done(stream, now)))
        for request_id, _ in finals:
            del self.running[request_id]
        self._count(len(tokens), len(finals))
        return Step(tokens, finals)

    def _remember_step(self, now: float) -> None:
        self.num_steps += 1
        self.recent_steps.append((self.num_steps, now))
        while self.recent_steps[0][1] < now - self.final_window_s:
            self.recent_steps.popleft()

    def _token(self, stream: _Stream, now: float) -> dict[str, Any]:
        index = stream.num_sent
        stream.num_sent += 1
        if stream.first_token_at is None:
            stream.first_step, stream.first_token_at = self.num_steps, now
        text = format_stamp(now) if self.stamp is Stamp.TEXT else PLAIN_TEXT
        body = wire.to_wire(wire.TokenBody(index, token_id(index, self.vocab_size), text))
        if self.stamp is Stamp.FIELD:
            body[STAMP_FIELD] = now
        return body

    def _done(self, stream: _Stream, now: float) -> dict[str, Any]:
        first_recent = max(0, self.recent_steps[0][0] - stream.first_step)   # one token per step
        tokens = tuple(wire.TokenBody(i, token_id(i, self.vocab_size), PLAIN_TEXT)
                       for i in range(first_recent, stream.num_sent))
        first = stream.first_token_at if stream.first_token_at is not None else now
        timings = wire.DecodeTimings(decode_queue_s=round(first - stream.admitted_at, 6),
                                     decode_s=round(now - first, 6))
        done = wire.DecodeDoneBody(self.node_id, "length", tokens, wire.PlanKind.LOCAL,
                                   wire.Usage(stream.num_prompt, stream.num_sent), timings,
                                   {"node_streams_running": len(self.running)})
        return wire.to_wire(done)

    def _count(self, num_tokens: int, num_finals: int) -> None:
        counters = self.counters
        counters["steps"] += 1
        counters["tokens"] += num_tokens
        counters["finished"] += num_finals
        counters["max_batch_seen"] = max(counters["max_batch_seen"], num_tokens)
