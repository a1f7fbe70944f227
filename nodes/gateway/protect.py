"""API keys and per-key rate limits (pure: every call takes `now`; the app passes the clock).

Contract:
- `check_api_key(authorization_header, keys) -> key` returns the Bearer key, "" when no keys are
  configured, or raises ApiError 401 (missing or unknown key). A configured key is either the key
  itself or `sha256:<hex digest of the key>` (so the config file need not hold usable secrets);
  every configured key is compared, each in constant time (hmac.compare_digest).
- `hash_api_key(key) -> "sha256:<hex>"`: what to put in the config instead of the key.
- `RateLimiter(rps, burst, max_streams)`: `acquire(identity, now)` admits one request (a token
  bucket of `burst` refilled at `rps`, and at most `max_streams` in flight per identity) or
  raises ApiError 429 with a `Retry-After` header (seconds until a token, or 1 s for streams);
  `release(identity)` when the request ends. 0 turns either limit off. Idle identities are
  forgotten so memory stays bounded by the number of active clients.
- `Limiter`: that pair of methods, the seam `Gateway` holds; `shared_limits.SharedRateLimiter` is
  the other side (the workers of `pdbus gateway --workers N` count in one table). Both refuse with
  `streams_exceeded(max_streams)` / `rate_exceeded(rps, tokens)`, so a client cannot tell them apart.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from typing import Protocol

from nodes.gateway.api_errors import ApiError

MAX_IDENTITIES = 100_000
HASH_PREFIX = "sha256:"


def hash_api_key(key: str) -> str:
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def _matches(token: bytes, token_digest: bytes, key: str) -> bool:
    if key.startswith(HASH_PREFIX):
        return hmac.compare_digest(token_digest, key[len(HASH_PREFIX):].strip().lower().encode())
    return hmac.compare_digest(token, key.encode())


def check_api_key(authorization: str | None, keys: tuple[str, ...]) -> str:
    if not keys:
        return ""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
    # Every key, each in constant time: timing reveals neither a key's prefix nor which key matched.
    digest = hashlib.sha256(token.encode()).hexdigest().encode()
    matched = False
    for key in keys:
        matched |= _matches(token.encode(), digest, key)
    if not matched:
        raise ApiError(401, "invalid API key", code="invalid_api_key")
    return token


class Limiter(Protocol):
    def acquire(self, identity: str, now: float) -> None: ...

    def release(self, identity: str) -> None: ...


def streams_exceeded(max_streams: int) -> ApiError:
    return ApiError(429, f"too many concurrent requests for this key (limit {max_streams})",
                    code="rate_limit_exceeded", headers={"Retry-After": "1"})


def rate_exceeded(rps: float, tokens: float) -> ApiError:
    """The refusal of a bucket holding `tokens` (< 1): Retry-After is when the next one is due."""
    wait = math.ceil((1.0 - tokens) / rps)
    return ApiError(429, f"rate limit of {rps:g} requests/s exceeded", code="rate_limit_exceeded",
                    headers={"Retry-After": str(max(1, wait))})


@dataclass
class _Bucket:
    tokens: float
    updated: float
    num_streams: int = 0


class RateLimiter:
    def __init__(self, rps: float = 0.0, burst: int = 20, max_streams: int = 0) -> None:
        self.rps, self.burst, self.max_streams = rps, max(1, burst), max_streams
        self.buckets: dict[str, _Bucket] = {}

    def acquire(self, identity: str, now: float) -> None:
        bucket = self._bucket(identity, now)
        if self.max_streams and bucket.num_streams >= self.max_streams:
            raise streams_exceeded(self.max_streams)
        if self.rps:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rps)
            bucket.updated = now
            if bucket.tokens < 1.0:
                raise rate_exceeded(self.rps, bucket.tokens)
            bucket.tokens -= 1.0
        bucket.num_streams += 1

    def release(self, identity: str) -> None:
        bucket = self.buckets.get(identity)
        if bucket is not None:
            bucket.num_streams = max(0, bucket.num_streams - 1)

    def _bucket(self, identity: str, now: float) -> _Bucket:
        bucket = self.buckets.get(identity)
        if bucket is None:
            if len(self.buckets) >= MAX_IDENTITIES:
                self._forget_idle(now)
            bucket = self.buckets[identity] = _Bucket(float(self.burst), now)
        return bucket

    def _forget_idle(self, now: float) -> None:
        full_after = self.burst / self.rps if self.rps else 0.0
        for identity, bucket in list(self.buckets.items()):
            if bucket.num_streams == 0 and now - bucket.updated >= full_after:
                del self.buckets[identity]
