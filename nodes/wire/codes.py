"""Every code a cluster request can end or fail with: ERROR.code from a node or the broker,
`ClusterError.code`, and the `code@node` entries of a request's trace.

Contract: `Code` is the one enum the cluster reads. It names the nodes' codes (docs/CLUSTER.md),
the client's own, and the bus's, which `bus.constants.ErrorCode` defines (named here again from
its members, so the values have one source; tests/nodes/wire/test_codes.py checks none is
missing). Members are `str`s: they travel on the wire, print in logs and compare as their values,
so a code a peer sent (a plain string) equals its member. A failed prefill is recorded in the
trace as `prefill_<code>` (PREFILL_FAILURE). `code_label(code)` maps any code onto the members
(also as `prefill_<code>`), anything else (a code a node invented) onto `other`: what a metric
label may carry.
"""

from __future__ import annotations

from enum import StrEnum

from bus.constants import ErrorCode


class Code(StrEnum):
    # what the nodes send
    FULL = "full"                          # no KV room now: backpressure, the request is offered again
    REJECTED = "rejected"                  # can never fit this engine (context, vocabulary)
    BAD_REQUEST = "bad_request"            # a malformed request body
    KV_FAILED = "kv_failed"                # the prefill node's KV send failed (checksums, timeout)
    KV_TIMEOUT = "kv_timeout"              # admitted KV that never arrived
    DRAINING = "draining"                  # the node is leaving or switching role: resume elsewhere
    # the client's own
    STALLED = "stalled"                    # a stream went silent for `stall_timeout_s`
    GAP = "gap"                            # tokens arrived without their predecessors
    PROTOCOL = "protocol"                  # a stream ended without its FINAL
    BAD_REPLY = "bad_reply"                # a node's reply did not parse (nodes/wire/body_codec.py)
    NO_PREFILL_NODE = "no_prefill_node"    # fell back to prefill on the decode node
    RETRIES_EXHAUSTED = "retries_exhausted"
    # the bus's (bus.constants.ErrorCode); `internal` is also a node failing while serving a request,
    # `overloaded` also the client giving up waiting for room, `malformed` also a request the client's
    # endpoint could not encode
    NO_NODE = ErrorCode.NO_NODE
    NODE_LOST = ErrorCode.NODE_LOST
    REQUEST_LOST = ErrorCode.REQUEST_LOST
    UNKNOWN_NODE = ErrorCode.UNKNOWN_NODE
    DUPLICATE_REQUEST = ErrorCode.DUPLICATE_REQUEST
    MALFORMED = ErrorCode.MALFORMED
    OVERSIZED = ErrorCode.OVERSIZED
    CANCELLED = ErrorCode.CANCELLED
    FORBIDDEN = ErrorCode.FORBIDDEN
    INTERNAL = ErrorCode.INTERNAL
    BACKLOG_FULL = ErrorCode.BACKLOG_FULL
    OVERLOADED = ErrorCode.OVERLOADED


PREFILL_FAILURE = "prefill_"   # the prefix of a failed prefill's code in the trace
_KNOWN = frozenset(Code)


def code_label(code: str) -> str:
    """`code` when the cluster knows it (also as `prefill_<code>`), else `other`."""
    return code if code in _KNOWN or code.removeprefix(PREFILL_FAILURE) in _KNOWN else "other"
