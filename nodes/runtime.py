"""The shape of every engine node process (prefill, decode, colocated), after vLLM's engine core:
three threads, queues between them, and the engine's busy loop never touching a socket.

- bus I/O thread: the `Endpoint` (its own uvloop loop) registers, heartbeats, and puts each
  Request / Direct / Cancel into its inbox; replies are handed back to it thread-safely. Engine
  compute never delays a heartbeat.
- KV thread: a `LoopThread` (nodes/loop_thread.py, uvloop) runs the `KVSender` / `KVReceiver`;
  what finishes there is posted into the same inbox as a plain event (`KvSendDone`, `KvArrived`).
- engine thread (the process's main thread): `NodeLoop.run()` takes inputs, gives each `Work`
  (prefill side, decode side) its turn, then publishes capacity when it changed; once idle it
  hands freed heap back to the OS (`nodes.heap`). Its `NodeControl` (nodes/node_control.py) sees
  every message first (CONTROL commands; requests refused while draining) and each turn (drains,
  hand-overs, role switches).

Contract for a `Work` (nodes/prefill_node.py, nodes/decode_node.py): `prepare() -> data endpoint | ""`
(before the endpoint exists), `attach(endpoint)`, `on_message(message) -> bool` (True: mine),
`work(now) -> bool` (True: did something, poll again at once), `next_deadline() -> float | None`,
`capacity() -> dict`, `close()`; for drains, `service`, `num_in_flight()`, `hand_over(reason)`.
`run_node(settings, make_works)` wires it all and serves until SIGINT (at once) or drained
(SIGTERM or a CONTROL `drain`: new work refused, running work finished or handed over within
`[node] drain_timeout_s`; a second SIGTERM stops at once). `engine_bounds(engine)` is what a work checks peer bodies against (nodes/wire/).
Nothing one request does ends the loop: works guard each handler (`GuardedWork`: the request
ends with ERROR `internal`, what it held is freed), and the loop itself catches what a work's turn
or a message's dispatch still raises (`work_failed`, `message_failed`, counted in `counters`).
Peer-supplied bodies reach a log line only as a bounded summary (type and size), never repr().
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bus.endpoint import Endpoint
from bus.log import get_logger
from bus.messages import Cancel, Direct, Error, Request
from nodes import wire
from nodes.engines.base import Engine
from nodes.heap import HeapTrimmer, configure_decode_heap, freeze_startup_objects
from nodes.loop_thread import LoopThread
from nodes.node_control import NodeControl
from nodes.node_lifecycle import Lifecycle
from nodes.node_settings import NodeSettings

IDLE_POLL_S = 0.1
CAPACITY_MIN_INTERVAL_S = 0.02


class Work(Protocol):
    def prepare(self) -> str: ...
    def attach(self, endpoint: Endpoint) -> None: ...
    def on_message(self, message: Any) -> bool: ...
    def work(self, now: float) -> bool: ...
    def next_deadline(self) -> float | None: ...
    def capacity(self) -> dict[str, float]: ...
    def on_idle(self) -> None: ...   # the node went quiet: caches kept for a busy node let go
    def close(self) -> None: ...


class GuardedWork:
    """What the prefill and decode works share: one request's bug ends that request, never the node.

    `_guard(request_id, handler, *args, ours=False)` runs one handler; if it raises, the failure is
    logged with the request id and counted (`counters["request.failed"]`), `_release(request_id)`
    frees what the request held, and its client gets ERROR `internal` when it waits on us (`ours`,
    or the request is in `jobs`). `_end_failed(request_id, reply=...)` is that end without a handler.
    `num_in_flight()` and `hand_over(reason)` are what a drain asks of a work (nodes/node_control.py).
    `endpoint` is the node's, set by the work's `attach` before any message or turn reaches it.
    """

    jobs: dict[str, Any]
    counters: Counter[str]
    log: Any
    _endpoint: Endpoint | None = None

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to an endpoint yet")
        return self._endpoint

    def _release(self, request_id: str, reason: str = "the node failed") -> Any:
        raise NotImplementedError

    def num_in_flight(self) -> int:
        return len(self.jobs)

    def hand_over(self, reason: str) -> int:
        """A drain's deadline passed: end every request with ERROR `draining` (its client resumes
        it elsewhere: a decode stream from the tokens it has, this step's sent already; a prompt
        at another prefill node), freeing what it held."""
        request_ids = list(self.jobs)
        for request_id in request_ids:
            self._release(request_id, reason)
            self.endpoint.reply_error(request_id, wire.Code.DRAINING, reason, node_id=self.endpoint.node_id)
        return len(request_ids)

    def _guard(self, request_id: str, handler: Callable[..., Any], *args: Any, ours: bool = False) -> None:
        ours = ours or request_id in self.jobs
        try:
            handler(*args)
        except Exception:
            self.counters["request.failed"] += 1
            self.log.exception("request_failed", request_id=request_id, stage=handler.__name__.strip("_"))
            self._end_failed(request_id, reply=ours)

    def _end_failed(self, request_id: str, *, reply: bool) -> None:
        try:
            self._release(request_id)
        except Exception:
            self.log.exception("release_failed", request_id=request_id)
        if reply:
            self.endpoint.reply_error(request_id, wire.Code.INTERNAL, "the node failed while serving this request",
                                      node_id=self.endpoint.node_id)


def message_summary(message: Any) -> dict[str, Any]:
    """A log line's view of a bus message: its kind, ids and the body's type and size, never the
    body itself (repr() of a body nested a thousand levels deep raises RecursionError)."""
    summary: dict[str, Any] = {"kind": type(message).__name__}
    for name in ("request_id", "peer", "service", "code"):
        if isinstance(value := getattr(message, name, None), str):
            summary[name] = value[:128]
    if hasattr(message, "body"):
        summary["body"] = wire.summary(message.body)
    return summary


@dataclass
class StageClock:
    """Per-request stage timestamps (monotonic), turned into durations for FINAL bodies."""

    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, now: float | None = None) -> None:
        self.marks.setdefault(name, time.monotonic() if now is None else now)

    def seconds(self, start: str, end: str) -> float | None:
        if start in self.marks and end in self.marks:
            return round(self.marks[end] - self.marks[start], 6)
        return None


class NodeLoop:
    def __init__(self, endpoint: Endpoint, works: list[Work], stop: threading.Event,
                 control: NodeControl | None = None) -> None:
        self.endpoint, self.works, self.stop, self.control = endpoint, works, stop, control
        self.log = get_logger("node", node_id=endpoint.node_id)
        self._capacity: dict[str, float] = {}
        self._capacity_sent_at = 0.0
        self.heap = HeapTrimmer(before_trim=self._on_idle)
        self.counters: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                timeout = self._turn(time.monotonic())
            except Exception:   # capacity, heap, deadlines: a bug there must not end the node either
                self._count_failure("turn_failed")
                timeout = IDLE_POLL_S
            self._take_inputs(timeout)

    def _turn(self, now: float) -> float:
        """Give each work its turn; how long to wait for input next."""
        if self.control is not None and self.control.turn(now):
            self.stop.set()   # drained: leave
            return 0.0
        busy = False
        for work in self.works:
            try:
                busy = work.work(now) or busy
            except Exception:   # the work's own guards failed what requests they could
                self._count_failure("work_failed", work=type(work).__name__)
        self._publish_capacity(now)
        if (trim_s := self.heap.on_iteration(busy, now)) is not None:
            self.log.info("heap_trimmed", ms=round(trim_s * 1000, 2))
        return 0.0 if busy else self._idle_timeout(now)

    def _count_failure(self, event: str, **fields: Any) -> None:
        self.counters[event.replace("_", ".")] += 1
        self.log.exception(event, count=self.counters[event.replace("_", ".")], **fields)

    def _on_idle(self) -> None:
        for work in self.works:
            work.on_idle()

    def _idle_timeout(self, now: float) -> float:
        deadlines = [d for w in self.works if (d := w.next_deadline()) is not None]
        return max(0.0, min([IDLE_POLL_S, *(d - now for d in deadlines)]))

    def _take_inputs(self, timeout: float) -> None:
        try:
            self._dispatch(self.endpoint.receive(timeout))
        except TimeoutError:
            return
        while len(self.endpoint.inbox):
            self._dispatch(self.endpoint.receive(0))

    def _dispatch(self, message: Any) -> None:
        try:
            self._offer(message)
        except Exception:   # a bad message must not take the node (and every other stream) down
            self._count_failure("message_failed", **message_summary(message))
            if isinstance(message, Request):
                self.endpoint.reply_error(message.request_id, wire.Code.INTERNAL, "the node failed to handle this request")

    def _offer(self, message: Any) -> None:
        if self.control is not None and self.control.offer(message, time.monotonic()):
            return
        for work in self.works:
            if work.on_message(message):
                return
        if isinstance(message, Request):
            self.endpoint.reply_error(message.request_id, wire.Code.BAD_REQUEST,
                                      f"no service {message.service[:128]!r} here")
        elif isinstance(message, Error | Direct | Cancel):
            self.log.info("unhandled_message", **message_summary(message))

    def current_capacity(self) -> dict[str, float]:
        """The works' reports (a switchable node's: the current role's), and the lifecycle's keys."""
        capacity: dict[str, float] = {}
        for work in self.works:
            if self.control is None or self.control.active(work):
                capacity.update(work.capacity())
        return capacity | (self.control.capacity() if self.control is not None else {})

    def publish_now(self) -> None:
        self._publish_capacity(time.monotonic(), force=True)

    def _publish_capacity(self, now: float, force: bool = False) -> None:
        capacity = self.current_capacity()
        if capacity != self._capacity and (force or now - self._capacity_sent_at >= CAPACITY_MIN_INTERVAL_S):
            self._capacity, self._capacity_sent_at = capacity, now
            self.endpoint.update_capacity(capacity)
            self.log.info("capacity_updated", capacity=capacity)


def engine_bounds(engine: Engine) -> wire.Bounds:
    """The engine's vocabulary and context: what a node checks token ids and prompts against."""
    return wire.Bounds(vocab_size=engine.vocab_size, max_model_len=engine.max_model_len)


def kernel_report(works: list[Work]) -> dict[str, object]:
    """What serves each operation in the node's engine (`Engine.kernel_report`), {} without one."""
    for work in works:
        engine = getattr(work, "engine", None)
        if isinstance(engine, Engine):
            return engine.kernel_report()
    return {}


def engine_dtype(works: list[Work]) -> str | None:
    """The dtype the node's engine runs in (what `[engine] dtype = "auto"` chose), None without one."""
    for work in works:
        engine = getattr(work, "engine", None)   # a Work may have none (the idle node's)
        if isinstance(engine, Engine):
            return engine.kv_layout.dtype_name
    return None


def run_node(settings: NodeSettings, make_works: Callable[[LoopThread], list[Work]]) -> int:
    """Serve as one node process until SIGINT, or drained (SIGTERM, a CONTROL `drain`); the exit code."""
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    kv_thread = LoopThread("kv")
    works = make_works(kv_thread)
    data_endpoint = next((e for e in (w.prepare() for w in works) if e), "")
    endpoint = Endpoint(settings.broker, settings.role, settings.node_id, heartbeat=settings.heartbeat,
                        data_endpoint=data_endpoint, security=settings.security)
    for work in works:
        work.attach(endpoint)
    control = NodeControl(endpoint, works, Lifecycle(settings.role, switchable=settings.switchable,
                                                     drain_timeout_s=settings.drain_timeout_s))
    signal.signal(signal.SIGTERM, lambda *_: control.terminate())   # drain, then leave; twice: now
    loop = NodeLoop(endpoint, works, stop, control)
    control.publish_now = loop.publish_now
    for work in works:
        if hasattr(work, "publish_capacity"):
            work.publish_capacity = loop.publish_now
    endpoint.core.capacity = loop.current_capacity()   # READY carries it
    log = get_logger("node", node_id=endpoint.node_id, role=settings.role)
    freeze_startup_objects()   # the weights live as long as the process (nodes.heap)
    if settings.role == "decode":
        configure_decode_heap()   # nodes.heap: what KV memory goes back to the OS, and when
    with endpoint:
        log.info("node_started", data_endpoint=data_endpoint, model=settings.model, dtype=engine_dtype(works),
                 curve=bool(settings.security), kv_quant=settings.kv_quant, capacity=endpoint.core.capacity,
                 **kernel_report(works))
        try:
            loop.run()
        finally:
            for work in works:
                work.close()
    kv_thread.stop()
    log.info("node_stopped")
    return 0
