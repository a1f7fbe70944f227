"""The bodies of the cluster's control-plane messages (docs/CLUSTER.md), shared by the node
processes and `ClusterClient`. Plain dicts on the wire (the bus codec owns msgpack); these helpers
build and read them so both sides agree on every field name. No torch here: the client imports it.

Services: `decode` (decode and both nodes), `prefill` (prefill and both nodes).
- decode REQUEST  `{prompt_token_ids, sampling, session_id, prefill: "auto"|"local", resume}`
- decode PARTIAL  `plan` first, then `token` (index relative to this request, 1.. after a remote
                  prefill, 0.. otherwise); FINAL `done` with `tokens` (every output [id, text] of
                  this request, so a client that saw a gap can fill it), `usage`, `timings`, `stats`.
- prefill REQUEST `{prompt_token_ids, sampling, decode_node_id, data_endpoint, transfer_id,
                  request_id}`; PARTIAL `token` index 0; FINAL `done` with the transfer report.
- DIRECT prefill -> decode `{type: "kv_ready", request_id, transfer_id, first_token_id}`.
Error codes the nodes send: `full` (no KV room now), `rejected` (never fits), `kv_failed`,
`kv_timeout`, `bad_request`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nodes.engines.base import SamplingParams

DECODE, PREFILL = "decode", "prefill"
PLAN_REMOTE, PLAN_CACHED, PLAN_LOCAL = "remote", "cached", "local"
KV_READY = "kv_ready"
FULL, REJECTED, KV_FAILED, KV_TIMEOUT, BAD_REQUEST = "full", "rejected", "kv_failed", "kv_timeout", "bad_request"


class BadRequest(ValueError):
    """A request body the node cannot serve (answered with ERROR `bad_request`)."""


def sampling_to_wire(sampling: SamplingParams) -> dict[str, Any]:
    values = dataclasses.asdict(sampling)
    values["stop"], values["stop_token_ids"] = list(sampling.stop), list(sampling.stop_token_ids)
    return values


def sampling_from_wire(values: Any) -> SamplingParams:
    if not isinstance(values, dict):
        raise BadRequest("sampling must be a map")
    known = {k: v for k, v in values.items() if k in SamplingParams.__dataclass_fields__}
    known["stop"] = tuple(known.get("stop", ()))
    known["stop_token_ids"] = tuple(known.get("stop_token_ids", ()))
    try:
        return SamplingParams(**known)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling: {exc}") from exc


def token_ids_from_wire(body: dict, key: str = "prompt_token_ids") -> tuple[int, ...]:
    ids = body.get(key)
    if not isinstance(ids, list | tuple) or not ids or not all(isinstance(t, int) for t in ids):
        raise BadRequest(f"{key} must be a non-empty list of token ids")
    return tuple(ids)


def body_map(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a map")
    return body


def token_body(index: int, token_id: int, text: str) -> dict[str, Any]:
    return {"type": "token", "index": index, "token_id": token_id, "text": text}


def kv_ready_body(request_id: str, transfer_id: str, first_token_id: int) -> dict[str, Any]:
    return {"type": KV_READY, "request_id": request_id, "transfer_id": transfer_id,
            "first_token_id": first_token_id}
