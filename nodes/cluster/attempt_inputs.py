"""What one cluster request attempt (nodes/cluster/attempt.py) is given: the request it asks for
(`AttemptSpec`), the generation it serves as it sees it (`AttemptOwner`), and the client's count of
prompt tokens waiting at prefill nodes (`PrefillBacklog`, read by the lending rule).

Contract: `AttemptSpec` is frozen when the attempt starts; `AttemptOwner` is a Protocol that
`Generation` (nodes/cluster/generation.py) implements and tests fake; `PrefillBacklog.holding(n)`
counts `n` tokens until its block ends or the release it yields is called, never twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bus.mailbox import ReplyStream
from nodes import wire
from nodes.cluster.results import RequestTrace, StreamToken


@runtime_checkable
class AttemptOwner(Protocol):
    """The generation an attempt serves, as the attempt sees it (`Generation` implements it)."""

    @property
    def num_delivered(self) -> int:
        """Tokens the caller has had: the stream index the next `emit` carries."""

    @property
    def trace(self) -> RequestTrace:
        """Where the attempt records plans, nodes, failures, transfers and timings."""

    def emit(self, token: StreamToken) -> None:
        """Hand the caller the token at index `num_delivered`."""

    def spend_retry(self, code: str, message: str, node_id: str = "") -> None:
        """Spend one retry of the request's budget; `ClusterError` past it."""

    def bounce_off_drain(self) -> bool:
        """Whether one more `draining` answer may go out again without spending a retry."""

    def keep_prompt_logprobs(self, values: tuple[wire.TokenLogprobs | None, ...]) -> None:
        """The prompt's logprobs, from whichever node prefilled it (a FINAL); kept once."""

    @property
    def prompt_logprobs(self) -> tuple[wire.TokenLogprobs | None, ...]:
        """What `keep_prompt_logprobs` kept (empty until then)."""

    @property
    def prefill_backlog(self) -> PrefillBacklog:
        """The client's prompt tokens waiting at prefill nodes (every request's, shared)."""

    def open_stream(self, service: str, body: dict, key: str = "") -> ReplyStream:
        """Send a request on the bus; ValueError when the endpoint cannot encode it."""


class PrefillBacklog:
    """Prompt tokens a client has sent to prefill nodes and not yet seen prefilled: what a new
    decode request reports (`prefill_backlog_tokens`) so a lightly loaded decode node may prefill
    it itself instead (the lending rule, docs/CLUSTER.md)."""

    def __init__(self) -> None:
        self.num_tokens = 0

    @contextlib.contextmanager
    def holding(self, num_tokens: int) -> Iterator[Callable[[], None]]:
        """Count `num_tokens` until the block ends or the release it yields is called (the
        prompt's first token came back: it left the prefill node's queue)."""
        held = [num_tokens]
        self.num_tokens += num_tokens

        def release() -> None:
            self.num_tokens -= held.pop() if held else 0

        try:
            yield release
        finally:
            release()


@dataclass(frozen=True, slots=True)
class AttemptSpec:
    """What one attempt asks the cluster for, fixed when it starts."""

    request_id: str
    session_id: str
    prompt: tuple[int, ...]          # the caller's prompt and every token delivered before this attempt
    sampling: wire.SamplingParams    # `max_tokens`: what is left to generate
    base: int                        # tokens delivered before it: its relative index 0 is stream index `base`
    local: bool                      # ask for `prefill: "local"` (no prefill node alive)
    plan_timeout_s: float            # the wait for a plan (the broker may queue the request meanwhile)
    retry_delay_s: float             # the pause before a prefill re-send whose failure names none
    cache_salt: str = ""             # the prefill node's prefix-cache scope (the gateway's tenant)
    fork_group: str = ""             # the n choices of one prompt (nodes/decode_forks.py)
    route_key: str = ""              # the decode routing key when not the session's (a choice's leader's)
