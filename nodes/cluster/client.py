"""`ClusterClient`: the bus-level client of the cluster, orchestrating one request per
docs/CLUSTER.md (what the gateway wraps). No torch: it imports only the bus and the wire bodies.

Contract:
    async with ClusterClient("tcp://127.0.0.1:5555", tokenizer=None, max_retries=3) as client:
        generation = client.generate(prompt_token_ids | text, sampling, session_id=None, request_id=None,
                                     cache_salt="", fork_group="", route_key="")
        async for token in generation:      # StreamToken(index, token_id, text, logprobs), each index once, in order
            ...
        generation.result                    # GenerationResult: token_ids, text, finish_reason, usage, trace,
                                             #   tokens, prompt_logprobs (with `sampling.prompt_logprobs`)
        await generation.aclose()            # or generation.cancel(): aborts both streams (KV freed)
    client.generate_blocking(...) -> GenerationResult   (from a thread with no running loop)
`fork_group` and `route_key`: the n samples of one prompt name one group and route by the first
one's key, so the later ones may decode from its KV (plan `forked`, nodes/decode_forks.py).
`trace` (RequestTrace, nodes/cluster/results.py) says which nodes served the request, the plans,
every failure, whether a failover or the local-prefill fallback happened, and the stage timings.
Failures: a decode node lost, stalled or timing out -> resume on another decode node with the
prompt plus every token delivered (indices continue; duplicates dropped); a prefill node lost or
`kv_failed` -> the prefill is re-sent with a new transfer id; `no_node` for prefill -> the decode
request is re-asked with `prefill: "local"`. Every retry counts against `max_retries`; past it, or
on `overloaded` / `rejected` / `bad_request` / `malformed`, iteration raises `ClusterError` (never a hang: every
wait is bounded by `stall_timeout_s`, the wait for a plan by `plan_timeout_s`, which exceeds the
broker queue's timeout). A decode node answering `full` (no KV room yet) is backpressure, not a
failure: the request is offered again after a growing pause (the node now advertises `full`, so
the broker places it elsewhere or holds it in its queue) without spending a retry, until it has
waited `plan_timeout_s` for room in all; then `overloaded` (503 + Retry-After at the gateway).
What the bus cannot carry never leaves: `generate` raises `wire.Uncarriable` (a ValueError
naming the field) for a session id over the bus's routing-key bound, strings that are not UTF-8,
ints beyond 64 bits, non-finite floats; and should the bus endpoint still refuse to encode a
request (`ProtocolError`, raised by `stream()` in the caller), iteration raises `ClusterError`
`malformed` at once, without a retry.
A node whose reply body does not parse (nodes/wire/) failed the request like a lost node:
the client fails over (decode resume, routed away from that node; prefill re-sent), spending a
retry, and counts it in `trace.num_bad_replies`. A bug in the client itself ends the stream with
`ClusterError("internal")`, logged with its traceback (never an exception left in a task).
Nothing is kept per request once it ends: its streams are cancelled (or finished) whatever the
ending, and the client holds no table of generations.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from bus.bus_client import BusClient
from bus.liveness import HeartbeatConfig
from bus.mailbox import ReplyStream
from nodes import wire
from nodes.cluster.attempt_inputs import PrefillBacklog
from nodes.cluster.generation import Generation
from nodes.cluster.results import GenerationResult


class ClusterClient:
    def __init__(self, broker_endpoint: str, *, node_id: str | None = None, heartbeat: HeartbeatConfig | None = None,
                 tokenizer: Any = None, max_retries: int = 3, stall_timeout_s: float = 30.0,
                 plan_timeout_s: float = 60.0, retry_delay_s: float = 0.2, security: Any = None) -> None:
        self.bus = BusClient(broker_endpoint, node_id, heartbeat=heartbeat, security=security)
        self.tokenizer = tokenizer
        self._started = False
        self.max_retries, self.stall_timeout_s, self.retry_delay_s = max_retries, stall_timeout_s, retry_delay_s
        self.prefill_backlog = PrefillBacklog()   # shared by its requests: what each decode request reports
        self.no_prefill_node_until = 0.0          # monotonic time until which new requests ask for a local prefill
        self.plan_timeout_s = plan_timeout_s   # > [scheduler] queue_timeout_s: a queued request is not "stalled"

    def start(self, timeout: float = 10.0) -> ClusterClient:
        """Register with the broker (idempotent); TimeoutError when no broker answers."""
        if not self._started:
            self.bus.start(timeout)
            self._started = True
        return self

    def close(self) -> None:
        self.bus.close()
        self._started = False

    async def __aenter__(self) -> ClusterClient:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> ClusterClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompt: Sequence[int] | str, sampling: wire.SamplingParams | None = None, *,
                 session_id: str | None = None, request_id: str | None = None, cache_salt: str = "",
                 fork_group: str = "", route_key: str = "") -> Generation:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs ClusterClient(tokenizer=...)")
            prompt = self.tokenizer.encode(prompt)
        prompt = tuple(int(t) for t in prompt)
        if not prompt:
            raise ValueError("empty prompt")
        sampling, session_id = sampling or wire.SamplingParams(), session_id or uuid.uuid4().hex
        wire.check_request(prompt, sampling, session_id)   # wire.Uncarriable: nothing is sent
        for value, name in ((cache_salt, "cache_salt"), (fork_group, "fork_group"), (route_key, "route_key")):
            if value:
                wire.check_routing_key(value, name)
        return Generation(self, prompt, sampling, session_id, request_id or uuid.uuid4().hex, cache_salt,
                          fork_group=fork_group, route_key=route_key)

    def generate_blocking(self, prompt: Sequence[int] | str, sampling: wire.SamplingParams | None = None,
                          **options: Any) -> GenerationResult:
        async def run() -> GenerationResult:
            return await self.generate(prompt, sampling, **options).collect()
        return asyncio.run(run())

    def stream(self, service: str, body: dict, key: str = "") -> ReplyStream:
        return self.bus.stream(service, body, key=key, timeout=self.stall_timeout_s)

