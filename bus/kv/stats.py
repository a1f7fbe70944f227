"""Per-transfer statistics, for the caller's metrics and logs (both sides fill the same record)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TransferStats:
    """Counters of one transfer. `raw_bytes` are the engine's KV bytes, `wire_bytes` the payload sent."""

    transfer_id: str
    request_id: str
    mode: str = ""
    compression: str = ""
    num_chunks: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    checksum_failures: int = 0   # chunks whose payload failed its checksum
    rejected: int = 0            # chunks/messages refused: bad frame, mismatched header, overlap
    duplicates: int = 0          # chunks that arrived again after being accepted
    nacks: int = 0               # NACKs sent (receiver) or received (sender)
    resends: int = 0             # chunks or ENDs sent again (sender)
    compressed_frames: int = 0
    stored_frames: int = 0

    @property
    def ratio(self) -> float:
        """raw / wire bytes (> 1: the wire carried less than the engine's KV)."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else 0.0

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    @property
    def retries(self) -> int:
        return self.resends


@dataclass(frozen=True, slots=True)
class TransferReport:
    """What `KVSender.send` returns once the receiver confirmed the transfer verified."""

    transfer_id: str
    request_id: str
    ok: bool
    reason: str
    stats: TransferStats


@dataclass(frozen=True, slots=True)
class TransferResult:
    """What the receiver hands its caller: a verified KV (ok) or a failure; never both."""

    transfer_id: str
    request_id: str
    ok: bool
    kv: object | None            # the destination the allocator gave, fully written (ok only)
    token_offset: int
    reason: str
    stats: TransferStats
