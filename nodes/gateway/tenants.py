"""Tenants: a session belongs to the API key that made it (pure).

Contract:
- `tenant_of(api_key) -> str`: "" for no key (no `api_keys` configured: one tenant, today's
  behaviour); otherwise a tag of TAG_CHARS hex characters, an HMAC-SHA256 (keyed with a fixed
  domain label) of the key's hashed form `sha256:<hex>`, so a key configured plain or hashed is
  the same tenant, and the tag is neither the key nor its configured hash.
- `cluster_session_id(tenant, session_id) -> str`: the session id the cluster sees, the decode
  request's routing key and the decode node's session-cache key: `<tag>.<session_id>`, or the
  session id itself for the single tenant. A key can only ever name sessions under its own tag,
  so another key's session id reaches a different cluster session: it neither reads the cached
  conversation (no `cached` plan, no shorter TTFT) nor evicts it. Bounded: TAG_CHARS + 1 +
  MAX_SESSION_ID_CHARS <= MAX_ID_BYTES, what the bus carries as a routing key.
- `new_session_id() -> str`: the public id for a request that named none (echoed as
  `X-Session-Id`, so the client can continue the session with the same key).
"""

from __future__ import annotations

import hashlib
import hmac
import uuid

from bus.constants import MAX_ID_BYTES
from nodes.gateway.fields import MAX_SESSION_ID_CHARS
from nodes.gateway.protect import hash_api_key

TAG_CHARS = 24   # 96 bits: no two keys of one deployment share a tag
_LABEL = b"pdbus gateway tenant v1"
assert TAG_CHARS + 1 + MAX_SESSION_ID_CHARS <= MAX_ID_BYTES


def tenant_of(api_key: str) -> str:
    if not api_key:
        return ""
    return hmac.new(_LABEL, hash_api_key(api_key).encode(), hashlib.sha256).hexdigest()[:TAG_CHARS]


def cluster_session_id(tenant: str, session_id: str) -> str:
    return f"{tenant}.{session_id}" if tenant else session_id


def new_session_id() -> str:
    return uuid.uuid4().hex
