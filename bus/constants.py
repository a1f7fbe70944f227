"""Control-plane protocol constants: header, command bytes, roles, reasons, error codes, defaults.

Contract: every other bus module takes its wire constants from here; docs/PROTOCOL.md part 1
documents the same values. Changing a value that travels on the wire means bumping VERSION.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

# Header frame: 3-byte signature, 1-byte version, 1-byte command (5 bytes, fixed size, so a
# peer validates it with one length check and two byte comparisons before reading anything else).
SIGNATURE = b"PDB"
VERSION = 3   # 2: STREAMS (0x0B), a decode FINAL repeats only recent tokens; 3: role `control`, CONTROL (0x0D)
HEADER_SIZE = 5


class Command(IntEnum):
    """One byte on the wire, after the signature and version."""

    READY = 0x01
    HEARTBEAT = 0x02
    DISCONNECT = 0x03
    CAPACITY = 0x04
    REQUEST = 0x05
    PARTIAL = 0x06
    FINAL = 0x07
    ERROR = 0x08
    DIRECT = 0x09
    CANCEL = 0x0A
    STREAMS = 0x0B   # several streams' next PARTIALs in one message (one engine step, one client)
    ADOPT = 0x0C     # requests moved here from a lost broker (served, or awaited)
    CONTROL = 0x0D   # an operator's command (drain, switch role) from a `control` peer to a serving node


# Roles a node announces in READY, and the services (request targets) each role serves.
# A colocated `both` node serves prefill and decode; a gateway serves nothing by default; a
# `control` peer (the planner, an operator's tool) serves nothing and may send CONTROL.
ROLES = ("prefill", "decode", "both", "gateway", "control")
SERVICES_BY_ROLE: dict[str, tuple[str, ...]] = {
    "prefill": ("prefill",),
    "decode": ("decode",),
    "both": ("prefill", "decode", "both"),
    "gateway": (),   # a gateway only asks: no REQUEST or DIRECT is ever routed to one
    "control": (),   # asks (the broker's stats) and commands nodes (CONTROL); serves nothing
}
# Roles that serve work: only these may send or receive DIRECTs, or announce `inflight` requests.
SERVING_ROLES = frozenset({"prefill", "decode", "both"})
# Roles that may send CONTROL (to a serving node). Under CURVE only keys admitted as `control` take it.
CONTROL_ROLES = frozenset({"control"})

# Capacity keys, by role (values are numbers; unknown keys are kept and passed to the policy).
DECODE_CAPACITY_KEYS = ("kv_blocks_total", "kv_blocks_free", "max_running")
PREFILL_CAPACITY_KEYS = ("max_batch_tokens", "queued_tokens")


class LeaveReason:
    """Why a node left the registry (NodeLeft.reason)."""

    EXPIRED = "expired"            # no traffic for a whole liveness window
    DISCONNECTED = "disconnected"  # it said DISCONNECT
    REPLACED = "replaced"          # the same node_id registered again from a new socket
    PROTOCOL_ERROR = "protocol_error"  # it sent something we could not accept (bad version, ...)
    CONNECTION_LOST = "connection_lost"  # its TCP connection closed and it did not come back at once


class DisconnectReason:
    """DISCONNECT.reason values (both directions)."""

    NOT_REGISTERED = "not_registered"  # broker -> peer: send READY first (e.g. broker restarted)
    BAD_VERSION = "bad_version"
    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    FORBIDDEN = "forbidden"           # broker -> peer: its CURVE key is not admitted for that role
                                      # (or the node id is bound to another key)
    OVERLOADED = "overloaded"         # broker -> peer: as many nodes registered as it keeps
    SHUTDOWN = "shutdown"             # node or broker is stopping cleanly


class ErrorCode(StrEnum):
    """ERROR.code values the bus itself produces; nodes may send their own codes too (the cluster's
    are `nodes.wire.Code`). Members are `str`s: they travel and compare as their values."""

    NO_NODE = "no_node"                  # no live node serves that service
    NODE_LOST = "node_lost"              # the node serving the request died or left
    REQUEST_LOST = "request_lost"        # after a broker restart nobody re-announced it
    UNKNOWN_NODE = "unknown_node"        # DIRECT to a node id that is not registered
    DUPLICATE_REQUEST = "duplicate_request"
    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    CANCELLED = "cancelled"
    FORBIDDEN = "forbidden"              # the sender's role may not send that (a gateway's DIRECT, a node's CONTROL)
    INTERNAL = "internal"                # the broker's routing policy failed on this request
    OVERLOADED = "overloaded"            # every node full and the broker's wait queue full or timed out
    BACKLOG_FULL = "backlog_full"        # the request never left its client: the backlog overflowed


class CancelReason:
    CLIENT = "client"            # the requesting client asked for it
    CLIENT_LOST = "client_lost"  # the requesting client died or left


# Drop counters (BrokerCore.metrics keys are "dropped.<reason>").
class DropReason:
    MALFORMED = "malformed"
    BAD_VERSION = "bad_version"
    OVERSIZED = "oversized"
    NOT_REGISTERED = "not_registered"
    FORBIDDEN = "forbidden"              # READY for a role (or a node id) the sender's key may not take
    OVERLOADED = "overloaded"            # READY for a new node id while MAX_NODES are registered
    UNKNOWN_REQUEST = "unknown_request"  # a reply/cancel for a request the broker does not know
    UNROUTABLE = "unroutable"            # the destination socket vanished or its queue is full


# Defaults: 250 ms x 3 missed beats -> a dead or frozen peer is declared dead after 750 ms,
# plus at most one tick (interval / 5), so under 1 s.
DEFAULT_HEARTBEAT_INTERVAL_S = 0.25
DEFAULT_LIVENESS = 3
# A serving node's link with no request heartbeats this slowly (PROTOCOL.md §1.4): 1,000 idle
# nodes cost the broker 2,000 messages/s instead of 8,000.
DEFAULT_IDLE_HEARTBEAT_INTERVAL_S = 1.0
MAX_IDLE_HEARTBEAT_INTERVAL_S = 60.0
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
# Whole-message limit (all frames). KV caches travel on the data plane, not through the broker.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A service the broker answers itself (one FINAL with its registry and queue figures), so a
# gateway can export live nodes by role and queue depths without a side channel.
BROKER_STATS_SERVICE = "pdbus.broker.stats"
MAX_ID_BYTES = 128          # request ids, node ids, service names, routing keys
MAX_STREAM_ENTRIES = 4096   # PARTIALs in one STREAMS message (an engine step's running streams)
MAX_CONTROL_BYTES = 4096    # a CONTROL body: a command and its few arguments
# Bounds on what peers send, checked when a body is decoded (docs/PROTOCOL.md §1.7). Bodies nest
# at most 4 deep today (a FINAL's token list); 32 leaves room, while Python's repr() and str()
# of a value fail at about 1,000 levels, inside the very handlers that log a bad message.
MAX_BODY_DEPTH = 32
MAX_READY_BYTES = 16 << 20      # READY is unpacked before its sender's role is known: bound it first
MAX_ANNOUNCED_IDS = 100_000     # READY inflight / pending, each (the endpoint backlog's size)
MAX_CAPACITY_KEYS = 64          # CAPACITY / READY capacity: names of at most 64 bytes, finite numbers
MAX_STATS_NODES = 1024          # serving nodes whose capacity the stats service lists: <= ~5 MB at 64 keys each
MAX_CAPACITY_KEY_BYTES = 64
MAX_ENDPOINT_BYTES = 512        # READY data_endpoint
MAX_TEXT_CHARS = 4096           # ERROR message, DISCONNECT detail: longer text is cut, not refused
MAX_CODE_BYTES = 64             # ERROR code, CANCEL and DISCONNECT reasons
# Reconnect back-off (node side): first retry after one interval, doubling, capped, jittered.
DEFAULT_BACKOFF_CAP_S = 4.0
