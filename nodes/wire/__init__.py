"""The cluster's control-plane bodies (docs/CLUSTER.md): what travels between the cluster client,
the decode nodes and the prefill nodes, shared by both sides. No torch here: the client imports it.
It sits beside the node processes and the client (nodes/cluster/), below both: each side reads the
other's bodies with the same code, and neither imports the other.

- bodies.py     one frozen dataclass per body (plan, token, done, kv_ready, the two requests, ...)
- body_codec.py `to_wire(body)` and `from_wire(kind, value, bounds)`: the one place that builds or
                reads their maps (request_readers.py and reply_readers.py hold the readers,
                field_readers.py the field checks, `Bounds` and `Refused`)
- codes.py      `Code`: every code a request can end or fail with, `code_label`
- carriable.py  what the bus can carry, checked before a request is sent (`Uncarriable`)
Import the names from here: `from nodes import wire`, then `wire.to_wire(wire.PlanBody.local(...))`.
"""

from nodes.wire.bodies import (
    CONTROL_ACTIONS,
    DECODE,
    FINISH_REASONS,
    PREFILL,
    SWITCH_ROLES,
    ControlBody,
    DecodeDoneBody,
    DecodeRequestBody,
    DecodeTimings,
    KvReadyBody,
    PlanBody,
    PlanKind,
    PrefillDoneBody,
    PrefillMode,
    PrefillRequestBody,
    PrefillTimings,
    SamplingParams,
    TokenBody,
    TokenLogprobs,
    TransferReport,
    Usage,
)
from nodes.wire.body_codec import claimed_node, claims, error_details, from_wire, read_partial, to_wire
from nodes.wire.carriable import MAX_DEPTH, Uncarriable, check_carriable, check_request, check_routing_key
from nodes.wire.codes import PREFILL_FAILURE, Code, code_label
from nodes.wire.field_readers import Bounds, Refused, summary

__all__ = ["CONTROL_ACTIONS", "DECODE", "FINISH_REASONS", "SWITCH_ROLES", "ControlBody", "MAX_DEPTH", "PREFILL", "PREFILL_FAILURE", "Bounds", "Code",
           "DecodeDoneBody", "DecodeRequestBody", "DecodeTimings", "KvReadyBody", "PlanBody", "PlanKind",
           "PrefillDoneBody", "PrefillMode", "PrefillRequestBody", "PrefillTimings", "Refused", "SamplingParams",
           "TokenBody", "TokenLogprobs", "TransferReport", "Uncarriable", "Usage", "check_carriable", "check_request",
           "check_routing_key", "claimed_node", "claims", "code_label", "error_details", "from_wire",
           "read_partial", "summary", "to_wire"]
