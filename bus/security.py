"""CurveZMQ on the bus: key files, who is admitted in which role, socket setup and the ZAP handler.

Contract:
- Key pairs live in a key directory as `<name>.key` (public) and `<name>.key_secret` (public and
  secret, created 0600 and never overwritten): `generate_keypair(dir, name) -> (public, secret)`,
  `load_keypair(dir, name)`, `load_public_key(dir, name_or_key)`. Keys are Z85 bytes (40 chars).
- `SecurityConfig(public_key, secret_key, server_key, admitted)`: this process's key pair, the
  broker's public key (what a client checks the server against) and `admitted`, the public keys a
  server accepts, each mapped to its `Principal(name, roles)`. A frozen value; `None` anywhere a
  `security=` argument is taken means plain TCP (the default on loopback).
- `apply_client(socket, config, server_key=None)` / `apply_server(socket, config)` set the CURVE
  options before connect/bind. `Gatekeeper.started(context, config)` is the ZAP handler (pyzmq's
  ThreadAuthenticator) of one context: it admits the configured public keys only, logs every refusal
  with a key fingerprint (never a key), counts them, and makes the peer's key its ZMQ User-Id, so
  `principal_of(frame)` on a received frame says who sent it.
- KV data endpoints: `with_server_key(endpoint, key)` / `split_server_key(endpoint)` carry a CURVE
  server's public key inside the endpoint string a decode node advertises (`tcp://h:p;curve=<hex>`),
  so a prefill node can authenticate the decode node it sends to.
- `is_loopback(endpoint)`: whether plain TCP stays on this machine.
ZAP is per zmq context: a CURVE server without a Gatekeeper on its context would accept every
client key, so servers here always create their own context and Gatekeeper together.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from bus.log import get_logger

log = get_logger("security")
ZAP_DOMAIN = "pdbus"
_ENDPOINT_KEY = ";curve="
KEY_LENGTH = 40   # Z85 of a 32-byte Curve25519 key
_ZAP_LOG = logging.getLogger("bus.security.zap")
_ZAP_LOG.setLevel(logging.WARNING)


class SecurityError(ValueError):
    """A key or security setting that cannot be used (missing file, bad key, bad permissions)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Whom an admitted public key belongs to, and which roles it may register as."""

    name: str
    roles: frozenset[str]


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    public_key: bytes
    secret_key: bytes
    server_key: bytes = b""                                  # the broker's public key (clients)
    admitted: Mapping[bytes, Principal] = field(default_factory=dict)   # servers: key -> principal

    def principal(self, public_key: bytes | str) -> Principal | None:
        key = public_key.encode() if isinstance(public_key, str) else public_key
        return self.admitted.get(key)


def fingerprint(public_key: bytes | str) -> str:
    """A short, stable name for a public key in logs (the key itself never goes to a log)."""
    key = public_key.encode() if isinstance(public_key, str) else public_key
    return hashlib.sha256(key).hexdigest()[:12]


# -- key files --------------------------------------------------------------------------------

def _key_paths(key_dir: str | Path, name: str) -> tuple[Path, Path]:
    if not name or "/" in name or name.startswith("."):
        raise SecurityError(f"bad key name {name!r}")
    base = Path(key_dir) / f"{name}.key"
    return base, base.with_name(f"{name}.key_secret")


def _certificate(public: bytes, secret: bytes | None) -> str:
    lines = ["#   pdbus CURVE certificate (ZeroMQ ZPL format)",
             "#   DO NOT share a .key_secret file or loosen its permissions." if secret else "#   public key",
             "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    # O_EXCL with the final mode: the secret is never readable by others, not even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def generate_keypair(key_dir: str | Path, name: str) -> tuple[bytes, bytes]:
    """Write `<name>.key` (0644) and `<name>.key_secret` (0600); refuses to overwrite either."""
    public_path, secret_path = _key_paths(key_dir, name)
    Path(key_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    if public_path.exists() or secret_path.exists():
        raise SecurityError(f"key {name!r} already exists in {key_dir}")
    public, secret = zmq.curve_keypair()
    _write_new(secret_path, _certificate(public, secret), 0o600)
    _write_new(public_path, _certificate(public, None), 0o644)
    return public, secret


def load_keypair(key_dir: str | Path, name: str) -> tuple[bytes, bytes]:
    """This process's key pair; the secret file must not be readable by group or others."""
    _, secret_path = _key_paths(key_dir, name)
    try:
        mode = secret_path.stat().st_mode & 0o077
        public, secret = zmq.auth.load_certificate(secret_path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot load the key pair {name!r} from {key_dir}: {exc}") from None
    if mode:
        raise SecurityError(f"{secret_path} is readable by group or others: chmod 600 it")
    if not secret:
        raise SecurityError(f"{secret_path} holds no secret key")
    return public, secret


def load_public_key(key_dir: str | Path, name_or_key: str) -> bytes:
    """A public key given inline (40 Z85 characters) or by the name of a `.key` file in `key_dir`."""
    if len(name_or_key) == KEY_LENGTH and not Path(key_dir, f"{name_or_key}.key").exists():
        try:
            zmq.utils.z85.decode(name_or_key)
        except ValueError:
            pass
        else:
            return name_or_key.encode()
    public_path, _ = _key_paths(key_dir, name_or_key)
    try:
        public, _ = zmq.auth.load_certificate(public_path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"no public key {name_or_key!r} in {key_dir}: {exc}") from None
    return public


def admitted_keys(key_dir: str | Path, admit: Mapping[str, list[str]]) -> dict[bytes, Principal]:
    """`{role: [key name or inline key, ...]}` -> `{public key: Principal}` (a key may hold several roles)."""
    names: dict[bytes, str] = {}
    roles: dict[bytes, set[str]] = {}
    for role, entries in admit.items():
        for entry in entries:
            key = load_public_key(key_dir, entry)
            names.setdefault(key, entry if len(entry) != KEY_LENGTH else fingerprint(key))
            roles.setdefault(key, set()).add(role)
    return {key: Principal(names[key], frozenset(roles[key])) for key in names}


# -- sockets ----------------------------------------------------------------------------------

def apply_client(socket: zmq.Socket, config: SecurityConfig, server_key: bytes | None = None) -> None:
    server = server_key or config.server_key
    if not server:
        raise SecurityError("CURVE client without the server's public key")
    socket.curve_secretkey = config.secret_key
    socket.curve_publickey = config.public_key
    socket.curve_serverkey = server


def apply_server(socket: zmq.Socket, config: SecurityConfig) -> None:
    socket.curve_server = True
    socket.curve_secretkey = config.secret_key
    socket.curve_publickey = config.public_key
    socket.zap_domain = ZAP_DOMAIN.encode()


def principal_of(frame: Any, config: SecurityConfig) -> Principal | None:
    """The admitted sender of a received zmq.Frame (None: plain frame or unknown key)."""
    try:
        user_id = frame.get("User-Id")
    except (AttributeError, zmq.ZMQError):
        return None
    return config.principal(user_id) if user_id else None


def with_server_key(endpoint: str, public_key: bytes) -> str:
    return f"{endpoint}{_ENDPOINT_KEY}{zmq.utils.z85.decode(public_key).hex()}"


def split_server_key(endpoint: str) -> tuple[str, bytes | None]:
    address, _, key_hex = endpoint.partition(_ENDPOINT_KEY)
    if not key_hex:
        return address, None
    try:
        return address, zmq.utils.z85.encode(bytes.fromhex(key_hex))
    except ValueError:
        raise SecurityError(f"bad CURVE key in data endpoint {address!r}") from None


def is_loopback(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on 127.0.0.0/8, ::1 or localhost (every one of a
    comma-separated list of brokers)."""
    if "," in endpoint:
        return all(is_loopback(part.strip()) for part in endpoint.split(","))
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False   # a host name or '*': may be reached from elsewhere


# -- the ZAP handler --------------------------------------------------------------------------

class _AdmittedKeys:
    """pyzmq's credentials-provider interface: `callback(domain, z85 key) -> bool`."""

    def __init__(self, gatekeeper: Gatekeeper) -> None:
        self.gatekeeper = gatekeeper

    def callback(self, domain: str, key: bytes) -> bool:
        principal = self.gatekeeper.config.principal(key)
        with self.gatekeeper.lock:
            self.gatekeeper.metrics["zap.allowed" if principal else "zap.denied"] += 1
        if principal is None:
            log.warning("peer_refused", reason="unknown CURVE key", key_fingerprint=fingerprint(key),
                        domain=domain)
        return principal is not None


class Gatekeeper(ThreadAuthenticator):
    """The ZAP handler of one zmq context: admits `config.admitted` keys only."""

    def __init__(self, context: zmq.Context, config: SecurityConfig) -> None:
        # pyzmq's authenticator logs client keys at DEBUG: keep its own log at WARNING and log
        # refusals ourselves, by fingerprint.
        super().__init__(context, log=_ZAP_LOG)
        self.config = config
        self.metrics: Counter[str] = Counter()
        self.lock = threading.Lock()

    @classmethod
    def started(cls, context: zmq.Context, config: SecurityConfig) -> Gatekeeper:
        gatekeeper = cls(context, config)
        gatekeeper.start()
        return gatekeeper

    def start(self) -> None:
        self.configure_curve_callback(ZAP_DOMAIN, _AdmittedKeys(self))   # before any handshake can ask
        super().start()
