"""Errors of the KV codec and data plane.

Contract: everything the KV code raises on bad input, bad frames or a failed transfer is a
`KVError`; callers catch that one class. Subclasses say which side of the contract broke.
"""

from __future__ import annotations


class KVError(Exception):
    """Base of every KV codec/data-plane error."""


class KVValueError(KVError):
    """The KV given to the codec cannot be encoded as asked (shape, dtype, non-finite values)."""


class KVFrameError(KVError):
    """A frame is malformed: bad magic/version, header checksum, field, length or frame count."""


class KVChecksumError(KVFrameError):
    """A chunk's payload or a transfer's digest does not match its checksum."""


class KVTransferFailed(KVError):
    """A transfer failed closed (retries exhausted, rejected, aborted); nothing was delivered."""

    def __init__(self, transfer_id: str, reason: str) -> None:
        super().__init__(f"KV transfer {transfer_id} failed: {reason}")
        self.transfer_id = transfer_id
        self.reason = reason


class KVTransferTimeout(KVTransferFailed):
    """A transfer made no progress within its timeout."""
