"""The bodies of the cluster's control-plane messages (docs/CLUSTER.md), one frozen dataclass each:
what producers build and consumers read. nodes/wire/body_codec.py turns them into the maps the bus
carries and back; nothing else builds or reads those maps.

Services: `decode` (decode and both nodes), `prefill` (prefill and both nodes).
- decode REQUEST        `DecodeRequestBody`   (client -> decode node)
- decode PARTIAL 0      `PlanBody`            remote | cached | local, with the decode node's id
- PARTIALs after it     `TokenBody`           index relative to the request that produced it
- decode FINAL          `DecodeDoneBody`      every token streamed, usage, timings, the node's stats
- prefill REQUEST       `PrefillRequestBody`  (client -> prefill node)
- prefill PARTIAL       `TokenBody`           index 0
- prefill FINAL         `PrefillDoneBody`     its token again, the `TransferReport`, timings, stats
- DIRECT                `KvReadyBody`         prefill node -> decode node: the KV is verified there
- CONTROL               `ControlBody`         control peer (the planner) -> node: drain, switch role
- inside both requests  `SamplingParams`      (nodes/engines/base.py)
Field values are plain Python values (tuples for lists); a timing a node did not measure is None.
`stats` is a map of numbers whose names a newer node may extend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

from nodes.engines.base import SamplingParams, TokenLogprobs

__all__ = ["CONTROL_ACTIONS", "DECODE", "FINISH_REASONS", "PREFILL", "ControlBody", "DecodeDoneBody", "DecodeRequestBody", "DecodeTimings",
           "KvReadyBody", "PlanBody", "PlanKind", "PrefillDoneBody", "PrefillMode", "PrefillRequestBody",
           "PrefillTimings", "SamplingParams", "TokenBody", "TokenLogprobs", "TransferReport", "Usage"]

DECODE, PREFILL = "decode", "prefill"   # the services
FINISH_REASONS = ("stop", "length", "abort")
# What a CONTROL asks of a node: `drain` (stop taking work, finish or hand over, then exit) or
# `role` (a switchable node drains its current role, then serves `role`, its engine kept loaded).
CONTROL_ACTIONS = ("drain", "role")
SWITCH_ROLES = (DECODE, PREFILL)


class PlanKind(StrEnum):
    REMOTE = "remote"   # send me the KV: a prefill node prefills, its KV comes to my data endpoint
    CACHED = "cached"   # a short suffix prefilled here on top of the session's cached KV
    LOCAL = "local"     # prefilled here (asked for, or a colocated node)
    FORKED = "forked"   # from the KV of a sibling request of the same prompt (`fork_group`) here


class PrefillMode(StrEnum):
    AUTO = "auto"       # the decode node chooses the plan
    LOCAL = "local"     # no prefill node alive: prefill on the decode node


@dataclass(frozen=True, slots=True)
class DecodeRequestBody:
    prompt: tuple[int, ...]
    sampling: SamplingParams
    session_id: str | None = None
    prefill: PrefillMode = PrefillMode.AUTO
    num_delivered: int = 0        # a resume: tokens delivered before this request (0: not a resume)
    cache_salt: str = ""          # kept-KV scope (the tenant): prefixes are reused only under one salt
    # Prompt tokens the client has waiting at prefill nodes now (not counting this request): a
    # decode node with a light batch may prefill this one itself rather than queue it there.
    prefill_backlog_tokens: int = 0
    # The n choices of one prompt name one group; a later one may decode from the KV the first
    # one's prefill sends here (nodes/decode_forks.py) instead of a prefill of its own.
    fork_group: str = ""


@dataclass(frozen=True, slots=True)
class PrefillRequestBody:
    prompt: tuple[int, ...]
    sampling: SamplingParams
    decode_node_id: str
    data_endpoint: str
    transfer_id: str
    request_id: str               # the decode request the KV is for
    urgent: bool = False          # a recovery: run before queued new prompts
    cache_salt: str = ""          # prefix-cache scope: prompts share cached KV only under one salt
    kv_offset: int = 0            # the decode node holds the KV of this many leading tokens: send the rest
    num_output_tokens: int = 0    # the prompt's last tokens are output delivered before (a resume)


@dataclass(frozen=True, slots=True)
class PlanBody:
    kind: PlanKind
    node_id: str
    data_endpoint: str = ""       # remote only
    transfer_id: str = ""         # remote only
    num_cached_tokens: int = 0    # leading prompt tokens whose KV this node holds (remote: not sent)

    @classmethod
    def remote(cls, node_id: str, data_endpoint: str, transfer_id: str, num_cached_tokens: int = 0) -> PlanBody:
        return cls(PlanKind.REMOTE, node_id, data_endpoint, transfer_id, num_cached_tokens)

    @classmethod
    def cached(cls, node_id: str, num_cached_tokens: int) -> PlanBody:
        return cls(PlanKind.CACHED, node_id, num_cached_tokens=num_cached_tokens)

    @classmethod
    def local(cls, node_id: str, num_cached_tokens: int = 0) -> PlanBody:
        return cls(PlanKind.LOCAL, node_id, num_cached_tokens=num_cached_tokens)


@dataclass(frozen=True, slots=True)
class TokenBody:
    index: int                    # relative to the request that produced it
    token_id: int
    text: str
    logprobs: TokenLogprobs | None = None   # when the request asked (`sampling.logprobs`)


@dataclass(frozen=True, slots=True)
class TransferReport:
    """A verified KV transfer, as the prefill node's sender saw it (missing fields read as zero)."""

    transfer_id: str = ""
    mode: str = ""
    compression: str = ""
    raw_bytes: int = 0
    wire_bytes: int = 0
    retries: int = 0
    checksum_failures: int = 0
    resends: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefillTimings:
    queue_s: float | None = None
    prefill_s: float | None = None
    kv_transfer_s: float | None = None

    def measured(self) -> dict[str, float]:
        return {name: seconds for name, seconds in asdict(self).items() if seconds is not None}


@dataclass(frozen=True, slots=True)
class DecodeTimings:
    kv_wait_s: float | None = None
    decode_queue_s: float | None = None
    decode_s: float | None = None

    def measured(self) -> dict[str, float]:
        return {name: seconds for name, seconds in asdict(self).items() if seconds is not None}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PrefillDoneBody:
    node_id: str                  # "" when the node did not say
    token: TokenBody | None
    transfer: TransferReport | None
    timings: PrefillTimings = PrefillTimings()
    stats: dict[str, int | float] = field(default_factory=dict)
    # With `sampling.prompt_logprobs`: one per prompt token, the first None.
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()


@dataclass(frozen=True, slots=True)
class DecodeDoneBody:
    node_id: str                  # "" when the node did not say
    finish_reason: str | None
    tokens: tuple[TokenBody, ...]
    plan: PlanKind | None = None
    usage: Usage = Usage()
    timings: DecodeTimings = DecodeTimings()
    stats: dict[str, int | float] = field(default_factory=dict)
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()   # when this node prefilled the prompt itself


@dataclass(frozen=True, slots=True)
class KvReadyBody:
    request_id: str               # the decode request
    transfer_id: str
    first_token_id: int


@dataclass(frozen=True, slots=True)
class ControlBody:
    action: str                   # one of CONTROL_ACTIONS
    role: str = ""                # for `role`: one of SWITCH_ROLES
