"""What a decode node keeps per request while its KV is on the way and while it decodes.

Contract: `DecodeJob` is one decode request (its plan, reserved blocks, the transfers planned or
received for it, the verified ones that `arrived`, the `kv_ready` first tokens, the node id its
kv_ready came from, what it streamed), with a `JobState` that only moves along `TRANSITIONS` (an
illegal move raises `JobError`):

    NEW --reserve--> WAITING --start--> RUNNING --finish--> FINISHED
    NEW --start--> RUNNING                      (a local or cached plan: admitted into the engine)
    WAITING --kv_arrived | kv_ready | transfer_failed--> WAITING
    NEW | WAITING | RUNNING --fail--> FAILED    (refused full/rejected, kv_timeout, internal)
    WAITING | RUNNING --cancel--> CANCELLED     (the client cancelled)

A WAITING job (remote plan) holds its blocks until one transfer has both halves, its verified KV
and its kv_ready (`ready_transfer()`); they travel on different planes, and a re-sent prefill may
overlap the first, so which halves are here is per transfer, not a state of the job. Only a
WAITING job takes KV or a kv_ready. `kv_ready_refusal(transfer_id, peer)` says why a kv_ready is
not accepted (docs/SECURITY.md, "Transfer binding"): `unknown_request` (not waiting for remote
KV), `unknown_transfer` (a transfer neither planned nor received for it), `wrong_peer` (another
node's kv_ready was accepted first and its transfer has not failed); `malformed` is the node's
own for a body that does not parse. `KvArrived` is the event the KV thread posts into the node's
inbox for every finished receive, ok or not. `plan_body` builds the plan PARTIAL (a remote plan's
new transfer id recorded on the job), `done_body` the FINAL `done`, `refusal_code(admission)` the
ERROR code of an engine's refusal, `plan_job` the plan. nodes/decode_node.py owns the logic.
"""

from __future__ import annotations

import bisect
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from bus.kv import TransferResult
from nodes import wire
from nodes.engines.base import (
    Admission,
    DecodeRequest,
    Engine,
    EngineStats,
    PrefillRequest,
    SamplingParams,
    TokenEvent,
    TokenLogprobs,
)
from nodes.runtime import StageClock


class JobState(Enum):
    NEW = "new"                # planned, admission not decided yet
    WAITING = "waiting"        # remote plan admitted: blocks held until its KV and kv_ready meet
    RUNNING = "running"        # in the engine
    FINISHED = "finished"      # its FINAL sent
    FAILED = "failed"          # ended with an ERROR
    CANCELLED = "cancelled"    # its client cancelled it


class JobEvent(Enum):
    RESERVE = "reserve"
    KV_ARRIVED = "kv_arrived"
    KV_READY = "kv_ready"
    TRANSFER_FAILED = "transfer_failed"
    START = "start"
    FINISH = "finish"
    FAIL = "fail"
    CANCEL = "cancel"


TRANSITIONS: dict[tuple[JobState, JobEvent], JobState] = {
    (JobState.NEW, JobEvent.RESERVE): JobState.WAITING,
    (JobState.NEW, JobEvent.START): JobState.RUNNING,
    (JobState.NEW, JobEvent.FAIL): JobState.FAILED,
    (JobState.WAITING, JobEvent.KV_ARRIVED): JobState.WAITING,
    (JobState.WAITING, JobEvent.KV_READY): JobState.WAITING,
    (JobState.WAITING, JobEvent.TRANSFER_FAILED): JobState.WAITING,
    (JobState.WAITING, JobEvent.START): JobState.RUNNING,
    (JobState.WAITING, JobEvent.FAIL): JobState.FAILED,
    (JobState.WAITING, JobEvent.CANCEL): JobState.CANCELLED,
    (JobState.RUNNING, JobEvent.FINISH): JobState.FINISHED,
    (JobState.RUNNING, JobEvent.FAIL): JobState.FAILED,
    (JobState.RUNNING, JobEvent.CANCEL): JobState.CANCELLED,
}


class JobError(RuntimeError):
    """A decode job was asked to make a move its lifecycle does not allow."""


class KvReadyRefusal(StrEnum):
    MALFORMED = "malformed"
    UNKNOWN_REQUEST = "unknown_request"
    UNKNOWN_TRANSFER = "unknown_transfer"
    WRONG_PEER = "wrong_peer"


def next_state(state: JobState, event: JobEvent) -> JobState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise JobError(f"no transition from {state} on {event}") from None


@dataclass(frozen=True, slots=True)
class KvArrived:
    """Posted by the KV thread into the node's inbox for every finished receive (ok or not)."""

    result: TransferResult


@dataclass
class DecodeJob:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None
    plan: wire.PlanKind
    state: JobState = JobState.NEW
    num_blocks: int = 0
    transfer_ids: set[str] = field(default_factory=set)
    arrived: dict[str, TransferResult] = field(default_factory=dict)
    kv_ready: dict[str, int] = field(default_factory=dict)
    ready_peer: str | None = None      # the node whose kv_ready was accepted (DIRECT peer)
    ready_transfer: str = ""           # ...naming this transfer
    tokens: list[wire.TokenBody] = field(default_factory=list)
    token_sent_at: list[float] = field(default_factory=list)   # when each of `tokens` left
    cache_salt: str = ""
    num_cached_tokens: int = 0         # leading prompt tokens whose KV this node has (the plan says so)
    num_held_tokens: int = 0           # ...of them, held by the engine for this request (Engine.hold_prefix)
    kv_raw_bytes: int = 0
    kv_wire_bytes: int = 0
    expires_at: float = 0.0
    clock: StageClock = field(default_factory=StageClock)
    num_output_tokens: int = 0         # the prompt's last tokens are output delivered before (a resume)
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()   # when this node prefilled them (prefill_here)

    @property
    def waiting(self) -> bool:
        return self.state is JobState.WAITING

    @property
    def running(self) -> bool:
        return self.state is JobState.RUNNING

    def _move(self, event: JobEvent) -> None:
        self.state = next_state(self.state, event)

    def reserve(self, num_blocks: int, expires_at: float) -> None:
        self._move(JobEvent.RESERVE)
        self.num_blocks, self.expires_at = num_blocks, expires_at

    def start(self) -> None:
        self._move(JobEvent.START)
        self.num_blocks = 0   # the engine holds its KV now

    def finish(self) -> None:
        self._move(JobEvent.FINISH)

    def fail(self) -> None:
        self._move(JobEvent.FAIL)

    def cancel(self) -> None:
        self._move(JobEvent.CANCEL)

    def kv_arrived(self, result: TransferResult) -> None:
        self._move(JobEvent.KV_ARRIVED)
        self.arrived[result.transfer_id] = result

    def kv_ready_refusal(self, transfer_id: str, peer: str) -> KvReadyRefusal | None:
        if not self.waiting:
            return KvReadyRefusal.UNKNOWN_REQUEST
        if transfer_id not in self.transfer_ids:
            return KvReadyRefusal.UNKNOWN_TRANSFER
        if self.ready_peer is not None and self.ready_peer != peer:
            return KvReadyRefusal.WRONG_PEER
        return None

    def accept_kv_ready(self, transfer_id: str, peer: str, first_token_id: int) -> None:
        self._move(JobEvent.KV_READY)
        self.ready_peer, self.ready_transfer = peer, transfer_id
        self.kv_ready[transfer_id] = first_token_id

    def transfer_failed(self, transfer_id: str) -> None:
        """The receive of `transfer_id` failed: its kv_ready (if any) no longer binds the request,
        so the client's retry on another prefill node can be accepted."""
        self._move(JobEvent.TRANSFER_FAILED)
        self.kv_ready.pop(transfer_id, None)
        if transfer_id == self.ready_transfer:
            self.ready_peer, self.ready_transfer = None, ""

    def ready_transfer_id(self) -> str | None:
        """A transfer whose verified KV and kv_ready are both here: the job can start from it."""
        return next((t for t in self.kv_ready if t in self.arrived), None)


def plan_job(job: DecodeJob, *, local: bool, num_session: int, short: int, hold: Callable[[], int]) -> None:
    """Choose the job's plan: `local` when asked (or colocated); `cached` when the session's KV
    (`num_session` tokens) leaves at most `short` tokens; else `hold()` the longest kept prefix
    (pinned for the request: its tokens) and prefill a rest of at most `short` here (`cached`), or
    have only the rest sent (`remote`). The node passes `short` 0 while it is busy: a short rest
    still costs a forward pass over every weight on the core that decodes every stream here, and
    the prefill node, whose prefix cache holds the same prefix, computes it as cheaply."""
    num_prompt = len(job.prompt)
    if not local and 0 < num_session < num_prompt <= num_session + short:
        job.plan, job.num_cached_tokens = wire.PlanKind.CACHED, num_session
        return
    held = hold()
    job.num_cached_tokens = job.num_held_tokens = held
    if local:
        job.plan = wire.PlanKind.LOCAL
    elif held and num_prompt - held <= short:
        job.plan = wire.PlanKind.CACHED


def prefill_here(engine: Engine, job: DecodeJob, request: DecodeRequest) -> tuple[DecodeRequest, TokenEvent]:
    """A local plan that asks for prompt logprobs: the engine's prefill pass computes them (the
    decode steps' chunked prefill keeps logits of a prompt's last position only), then the request
    decodes from that KV like one whose KV came from a prefill node; the first token is streamed
    from here. The pass runs in the node's loop: such requests are rare (scoring), and short."""
    result = engine.prefill([PrefillRequest(job.request_id, job.prompt, job.sampling, job.cache_salt,
                                            job.num_output_tokens)])[0]
    job.prompt_logprobs = result.prompt_logprobs
    first = TokenEvent(job.request_id, result.first_token_id, result.text, 0, logprobs=result.logprobs)
    return dataclasses.replace(request, kv=result.kv, first_token_id=result.first_token_id,
                               cached_prefix_tokens=0), first


def plan_body(job: DecodeJob, node_id: str, data_endpoint: str) -> wire.PlanBody:
    if job.plan == wire.PlanKind.REMOTE:
        transfer_id = uuid.uuid4().hex
        job.transfer_ids.add(transfer_id)
        return wire.PlanBody.remote(node_id, data_endpoint, transfer_id, job.num_cached_tokens)
    if job.plan == wire.PlanKind.CACHED:
        return wire.PlanBody.cached(node_id, job.num_cached_tokens)
    if job.plan == wire.PlanKind.FORKED:
        return wire.PlanBody(wire.PlanKind.FORKED, node_id)
    return wire.PlanBody.local(node_id, job.num_cached_tokens)


def refusal_code(admission: Admission) -> wire.Code:
    """`rejected` never fits this engine; anything else is `full` (no room now)."""
    return wire.Code.REJECTED if admission.status == "rejected" else wire.Code.FULL


def unconfirmed_tokens(job: DecodeJob, confirmed_before: float) -> tuple[wire.TokenBody, ...]:
    """The tokens sent at or after `confirmed_before`: those a broker lost now may not have
    forwarded (older ones were, or the endpoint replayed them: bus.endpoint_core), so the FINAL
    repeats only these for the client's gap repair."""
    first = bisect.bisect_left(job.token_sent_at, confirmed_before)
    return tuple(job.tokens[first:])


def done_body(job: DecodeJob, event: TokenEvent, node_id: str, stats: EngineStats,
              num_kv_bytes_received: int, confirmed_before: float) -> wire.DecodeDoneBody:
    """The FINAL `done`: the tokens streamed since `confirmed_before` (`unconfirmed_tokens`),
    usage (every token of the request), stage timings, the request's and the node's counters
    (`stats`: the engine's)."""
    num_output = event.index + (1 if event.token_id is not None else 0)
    timings = wire.DecodeTimings(kv_wait_s=job.clock.seconds("planned", "kv_arrived"),
                                 decode_queue_s=job.clock.seconds("admitted", "first_token"),
                                 decode_s=job.clock.seconds("first_token", "finished"))
    counters: dict[str, int | float] = {
        "num_cached_tokens": job.num_cached_tokens, "kv_raw_bytes": job.kv_raw_bytes,
        "kv_wire_bytes": job.kv_wire_bytes, "node_kv_bytes_received": num_kv_bytes_received,
        "node_prefilled_tokens": stats.num_prefilled_tokens,
        "node_imported_tokens": stats.num_imported_tokens, "node_reused_tokens": stats.num_reused_tokens,
        "node_prefix_reused_tokens": stats.num_prefix_reused_tokens}
    return wire.DecodeDoneBody(node_id, event.finish_reason, unconfirmed_tokens(job, confirmed_before), job.plan,
                               wire.Usage(len(job.prompt), num_output), timings, counters, job.prompt_logprobs)
